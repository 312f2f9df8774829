"""Worker script: ranks that disagree on a tensor's shape or dtype all get a clear error.

Run under bpslaunch (2 ranks). Rank 0 and the others push the same name with
another shape, then another dtype; every rank must see a PushPullError that
names both descriptions, and the job must go on working for other names.

Then a name used before: one rank switches it to another dtype, or back to
an earlier shape, while the others go on as before (each side has a tensor
of its own for that layout, so nothing meets but the switch's notice); every
rank must fail within the job's time, and the name must work afterwards,
switches the ranks agree on included (Horovod's allreduce/broadcast type
error tests run in one job).
"""

from __future__ import annotations

import torch
from check_runner import assert_equal, check

import byteps.torch as bps


def expect_push_pull_error(name, call):
    try:
        call()
    except bps.PushPullError as exc:
        print(f"MISMATCH {name}: {exc}", flush=True)
        return
    raise AssertionError(f"{name}: no PushPullError")


def main():
    bps.init()
    r = bps.rank()
    shape = (4,) if r == 0 else (2, 2)  # same number of bytes, another shape
    check("shape mismatch fails on every rank", lambda: expect_push_pull_error(
        "shape", lambda: bps.allreduce(torch.ones(shape), name="mismatch.shape")))
    dtype = torch.float32 if r == 0 else torch.int32  # same size, another dtype
    handle = bps.push_pull_async_inplace(torch.ones(3, dtype=dtype), name="mismatch.dtype")
    check("dtype mismatch fails on every rank", lambda: expect_push_pull_error(
        "dtype", lambda: bps.synchronize(handle)))

    def still_works():
        y = bps.push_pull(torch.full((3,), float(r + 1)), average=False, name="after.mismatch")
        assert_equal(y, torch.full((3,), float(bps.size() * (bps.size() + 1) // 2)), "push_pull after the errors")

    check("other names still work", still_works)
    check("a name whose first use the ranks disagreed on works afterwards", first_use_disagreed)
    check("a switch of a used name's layout that the others do not make fails on every rank", layout_switches)
    bps.shutdown()
    print("ALL OK 5", flush=True)


def first_use_disagreed():
    """Each rank added a layout of its own to the names above, and their first rounds failed everywhere: the
    names start afresh (Horovod's error tests reuse graph tensor names, e.g. 'mul:0', in one job)."""
    r, n = bps.rank(), bps.size()
    total = float(n * (n + 1) // 2)
    for name in ("mismatch.shape", "mismatch.dtype"):
        for shape in ((3,), (6,)):  # the same shape everywhere, then a switch every rank makes
            y = bps.allreduce(torch.full(shape, float(r + 1)), op=bps.Sum, name=name)
            assert_equal(y, torch.full(shape, total), f"{name} {shape} after its failed first use")
    # ranks naming different roots in a name's first broadcast (Horovod's broadcast_rank_error), then one root
    expect_push_pull_error("first roots", lambda: bps.broadcast(torch.ones(4), root_rank=r, name="first.roots"))
    assert_equal(bps.broadcast(torch.full((4,), float(r)), root_rank=n - 1, name="first.roots"),
                 torch.full((4,), float(n - 1)), "a broadcast after its failed first use")


def layout_switches():
    r, n = bps.rank(), bps.size()
    total = float(n * (n + 1) // 2)

    def agreed(shape, what):
        y = bps.allreduce(torch.full(shape, float(r + 1)), op=bps.Sum, name="switch")
        assert_equal(y, torch.full(shape, total), what)

    agreed((5,), "first use")
    dtype = torch.int32 if r == 0 else torch.float32  # rank 0 switches to a new dtype, the others stay
    expect_push_pull_error("switch dtype", lambda: bps.allreduce(torch.ones(5, dtype=dtype), name="switch"))
    agreed((5,), "the old layout after a refused switch")
    agreed((3,), "a switch every rank makes")
    shape = (5,) if r == 0 else (3,)  # rank 0 goes back to the first shape, the others stay
    expect_push_pull_error("switch back", lambda: bps.allreduce(torch.ones(shape), name="switch"))
    agreed((3,), "the layout in use after a refused switch back")
    agreed((5,), "a switch back every rank makes")
    # unnamed broadcasts, as Horovod's broadcast_type_error test issues them
    x = torch.ones(4, dtype=torch.int32 if r == 0 else torch.float32)
    bps.broadcast(torch.ones(4), root_rank=0, name="switch.b")
    expect_push_pull_error("broadcast switch", lambda: bps.broadcast(x, root_rank=0, name="switch.b"))
    bps.barrier()
    assert_equal(bps.broadcast(torch.full((4,), float(r)), root_rank=0, name="switch.b"), torch.zeros(4),
                 "broadcast after a refused switch")


if __name__ == "__main__":
    main()
