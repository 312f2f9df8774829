"""Worker script: push_pull / allreduce semantics and errors, checked by every rank.

Run under bpslaunch (2 ranks). Every tensor is derived from the rank, so
each rank computes the exact expected result itself. Prints ``OK <check>``
per check and ``ALL OK <n>`` at the end; the first failure exits 1.
"""

from __future__ import annotations

import threading
import time

import torch
from check_runner import Checks, assert_equal, expect_error

import byteps.torch as bps

DTYPES = [torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64]
SHAPES = [(7,), (3, 4), (2, 3, 5)]
BIG = 4 * 1024 * 1024  # float32 elements: 16 MB, several partitions
checks = Checks()


def value(shape, dtype, r):
    """Rank r's tensor: small integers (and halves for floats), exact in every dtype and sum."""
    k = (torch.arange(int(torch.Size(shape).numel())) % 17 - 8).reshape(shape)
    if dtype.is_floating_point:
        return (k.to(torch.float64) * 0.5 * (r + 1)).to(dtype)
    return (k * (r + 1) + r).to(dtype)


def expected(shape, dtype, average):
    total = sum(value(shape, torch.float64 if dtype.is_floating_point else torch.int64, r) for r in range(bps.size()))
    if average:
        total = total / bps.size() if dtype.is_floating_point else torch.div(total, bps.size(), rounding_mode="trunc")
    return total.to(dtype)


def dtypes_and_shapes():
    r = bps.rank()
    for dtype in DTYPES:
        for shape in SHAPES:
            for average in (True, False):
                tag = f"{str(dtype)[6:]}.{len(shape)}d.{'avg' if average else 'sum'}"
                x = value(shape, dtype, r)
                original = x.clone()
                y = bps.push_pull(x, average=average, name=f"pp.{tag}")
                assert_equal(y, expected(shape, dtype, average), f"push_pull {tag}")
                assert_equal(x, original, f"push_pull {tag} left its input alone")
                z = value(shape, dtype, r)
                out = bps.allreduce_(z, op=bps.Average if average else bps.Sum, name=f"ar_.{tag}")
                assert out is z
                assert_equal(z, expected(shape, dtype, average), f"allreduce_ {tag}")
                h = bps.allreduce_async(value(shape, dtype, r), average=average, name=f"ara.{tag}")
                assert_equal(bps.synchronize(h), expected(shape, dtype, average), f"allreduce_async {tag}")


def staggered(body_first, body_last):
    """The last rank waits 1 s, so the others' push_pulls are certainly still in flight meanwhile."""
    if bps.rank() == bps.size() - 1:
        time.sleep(1.0)
        body_last()
    else:
        body_first()


def async_handles():
    r, n = bps.rank(), bps.size()
    x = torch.full((BIG,), float(r + 1))
    want = torch.full((BIG,), float(n * (n + 1) // 2))
    called = threading.Event()

    def first():
        h = bps.push_pull_async(x, average=False, name="big")
        assert not bps.poll(h), "poll() was True before the last rank even pushed"
        expect_error(ValueError, "in flight", lambda: bps.push_pull_async(x, average=False, name="big"))
        bps.handle_done_callback(h, called.set)
        assert_equal(bps.synchronize(h), want, "synchronize(push_pull_async)")

    def last():
        h = bps.push_pull_async(x, average=False, name="big")
        bps.handle_done_callback(h, called.set)
        while not bps.poll(h):
            time.sleep(0.001)
        assert_equal(bps.synchronize(h), want, "synchronize(push_pull_async)")

    staggered(first, last)
    assert called.wait(5), "handle_done_callback's callback never ran"
    expect_error(ValueError, "unknown push_pull handle", lambda: bps.poll(10**9))

    # A named op that has finished is still in flight until its handle is synchronized (Horovod's
    # duplicate-name tests): every rank refuses the second submission, however fast the first one ended.
    small = torch.full((3,), float(r + 1))
    h = bps.allreduce_async(small, op=bps.Sum, name="held")
    while not bps.poll(h):
        time.sleep(0.001)
    expect_error(ValueError, "still in flight", lambda: bps.allreduce_async(small, op=bps.Sum, name="held"))
    assert_equal(bps.synchronize(h), torch.full((3,), float(n * (n + 1) // 2)), "the held op's result")
    bps.barrier()  # a refused call leaves the job usable
    assert_equal(bps.allreduce(small, op=bps.Sum, name="held"), torch.full((3,), float(n * (n + 1) // 2)),
                 "the name again after synchronize()")


def inplace_variants():
    r, n = bps.rank(), bps.size()
    total = float(n * (n + 1) // 2)
    x = torch.full((5,), float(r + 1))
    assert bps.push_pull_inplace(x, average=False, name="ppi") is x
    assert_equal(x, torch.full((5,), total), "push_pull_inplace")
    x = torch.full((5,), float(r + 1))
    h = bps.push_pull_async_inplace(x, average=True, name="ppai")
    assert bps.synchronize(h) is x
    assert_equal(x, torch.full((5,), total / n), "push_pull_async_inplace")
    x = torch.full((2, 2), float(r + 1))
    h = bps.allreduce_async_(x, op=bps.Sum, name="araa")
    assert bps.synchronize(h) is x
    assert_equal(x, torch.full((2, 2), total), "allreduce_async_")
    y = bps.allreduce(torch.full((3,), float(r + 1)), name="ar.default")  # Horovod's default: average
    assert_equal(y, torch.full((3,), total / n), "allreduce averages by default")
    for shape, dtype in (((6,), torch.float32), ((2, 3), torch.float32), ((6,), torch.int64), ((5,), torch.float32)):
        y = bps.push_pull(torch.full(shape, r + 1, dtype=dtype), average=False, name="ppi")  # a name reused
        assert_equal(y, torch.full(shape, int(total), dtype=dtype), f"name reused with shape {shape} {dtype}")


def gradients():
    r, n = bps.rank(), bps.size()
    for fn, kwargs, scale in ((bps.push_pull, {"average": True}, 1 / n), (bps.allreduce, {"op": bps.Sum}, 1.0),
                              (bps.allreduce, {}, 1 / n)):
        for name in ("grad.named", None):
            t = torch.full((4,), float(r + 1), requires_grad=True)
            y = fn(t, name=None if name is None else f"{name}.{fn.__name__}.{scale}", **kwargs)
            (y * (r + 1)).sum().backward()  # upstream gradient r + 1 on rank r
            want = torch.full((4,), n * (n + 1) / 2 * scale)
            assert_equal(t.grad, want, f"gradient of {fn.__name__}({kwargs}, name={name})")


def compression_and_scaling():
    r, n = bps.rank(), bps.size()
    total = float(n * (n + 1) // 2)
    x = torch.full((6,), float(r + 1), dtype=torch.float32)
    y = bps.allreduce(x, op=bps.Sum, name="fp16", compression=bps.Compression.fp16)
    assert y.dtype == torch.float32
    assert_equal(y, torch.full((6,), total), "fp16 compression")
    y = bps.push_pull(x, average=False, name="fp16.pp", compression=bps.Compression.fp16)
    assert_equal(y, torch.full((6,), total), "fp16 compression, push_pull")
    big = torch.full((6,), 1e6 * (r + 1))  # beyond float16's range (65504), within bfloat16's
    y = bps.allreduce(big, op=bps.Sum, name="bf16", compression=bps.Compression.bf16)
    assert y.dtype == torch.float32
    expected = torch.full((6,), 1e6).to(torch.bfloat16).float() * torch.arange(1, n + 1).sum().float()
    assert torch.allclose(y, expected, rtol=2 ** -7), (y, expected)  # bfloat16 keeps 8 bits of precision
    y = bps.allreduce(x, op=bps.Sum, name="scaled", prescale_factor=2.0, postscale_factor=0.25)
    assert_equal(y, torch.full((6,), total * 0.5), "prescale_factor / postscale_factor")
    z = torch.full((6,), float(r + 1))
    bps.allreduce_(z, op=bps.Sum, name="scaled_", postscale_factor=2.0)
    assert_equal(z, torch.full((6,), total * 2), "postscale_factor in place")


def default_names():
    r, n = bps.rank(), bps.size()
    for i in range(3):  # each call gets the next allreduce.noname.<n> on every rank
        y = bps.allreduce(torch.full((i + 1,), float(r)), op=bps.Sum)
        assert_equal(y, torch.full((i + 1,), float(n * (n - 1) // 2)), f"unnamed allreduce #{i}")
    h = bps.push_pull_async(torch.ones(2, dtype=torch.int64), average=False)
    assert_equal(bps.synchronize(h), torch.full((2,), n, dtype=torch.int64), "unnamed push_pull_async")
    # An unnamed op's name is its slot, held until synchronize(): the same on every rank however the ops'
    # ends interleave with the program (rank 0 lets its first op end before issuing the next; the others
    # do not).
    first = bps.allreduce_async(torch.full((3,), float(r)), op=bps.Sum)
    if r == 0:
        while not bps.poll(first):
            time.sleep(0.001)
    second = bps.allreduce_async(torch.full((4,), float(r)), op=bps.Sum)
    assert_equal(bps.synchronize(first), torch.full((3,), float(n * (n - 1) // 2)), "unnamed op in slot 0")
    third = bps.allreduce_async(torch.full((5,), float(2 * r)), op=bps.Sum)  # slot 0 again, on every rank
    assert_equal(bps.synchronize(third), torch.full((5,), float(n * (n - 1))), "unnamed op in a freed slot")
    assert_equal(bps.synchronize(second), torch.full((4,), float(n * (n - 1) // 2)), "unnamed op in slot 1")
    # A call refused on one rank only (bad input there) leaves the next unnamed call the name of the others'.
    if r == 0:
        expect_error(ValueError, "not contiguous", lambda: bps.allreduce(torch.ones(4, 2).t()))
    y = bps.allreduce(torch.full((2,), float(r)), op=bps.Sum)
    assert_equal(y, torch.full((2,), float(n * (n - 1) // 2)), "unnamed call after a refused one")


def errors():
    x = torch.arange(12.0).reshape(3, 4)
    expect_error(ValueError, "not contiguous", lambda: bps.push_pull(x.t(), name="nc"))
    expect_error(ValueError, "not contiguous", lambda: bps.allreduce_(x[:, ::2], name="nc2"))
    message = expect_error(ValueError, "unsupported dtype torch.uint8", lambda: bps.push_pull(
        torch.ones(3, dtype=torch.uint8), name="u8"))
    assert "torch.float32" in message and "torch.bfloat16" in message, message
    expect_error(ValueError, "torch.complex64", lambda: bps.allreduce(torch.ones(3, dtype=torch.complex64)))
    # Adasum (Horovod's): (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b for two ranks
    def mine(k):
        return torch.tensor([1.0, 2.0, -3.0, 0.5], dtype=torch.float64) * (k + 1) + torch.tensor([0, 1.0, 0, 0]) * k
    a, b = mine(0), mine(1)
    want = (1 - a @ b / (2 * a @ a)) * a + (1 - a @ b / (2 * b @ b)) * b
    got = bps.allreduce(mine(bps.rank()).float(), op=bps.Adasum, name="ad")
    assert torch.allclose(got.double(), want, rtol=1e-6), (got, want)
    inplace = mine(bps.rank()).float()
    bps.synchronize(bps.allreduce_async_(inplace, op=bps.Adasum, name="ad.inplace"))
    assert torch.equal(inplace, got), (inplace, got)
    expect_error(NotImplementedError, "floating-point", lambda: bps.allreduce(torch.ones(3, dtype=torch.int32),
                                                                               op=bps.Adasum, name="ad.int"))
    expect_error(ValueError, "supersedes", lambda: bps.allreduce(torch.ones(3), average=True, op=bps.Sum))
    # Integers scale as in Horovod: in float64, truncated (int(3 * 0.5) == 1 on every rank).
    scaled = bps.allreduce(torch.full((3,), 3, dtype=torch.int32), op=bps.Sum, prescale_factor=0.5, name="int.scale")
    assert torch.equal(scaled, torch.full((3,), bps.size(), dtype=torch.int32)), scaled
    expect_error(TypeError, "torch.Tensor", lambda: bps.push_pull([1.0, 2.0], name="list"))
    expect_error(ValueError, "root_rank", lambda: bps.broadcast(torch.ones(2), root_rank=bps.size()))
    # A refused op must leave nothing behind: the same name works afterwards on every rank.
    y = bps.push_pull(torch.ones(3), average=False, name="u8.after")
    assert_equal(y, torch.full((3,), float(bps.size())), "push_pull after refused ones")


def grouped_push_pull():
    """push_pull_group_async: every dtype, small (fused) and large (alone), in place, sum and average, fp16."""
    r = bps.rank()
    for rounds, average in ((2, True), (1, False)):
        for round_ in range(rounds):
            specs = [((3 + i % 5,), DTYPES[i % len(DTYPES)]) for i in range(40)] + [((20000,), torch.float32)]
            tensors = [value(shape, dtype, r) for shape, dtype in specs]
            names = [f"group.{'avg' if average else 'sum'}.{i}" for i in range(len(tensors))]
            handles = bps.push_pull_group_async(tensors, average=average, names=names)
            for i, (handle, tensor, (shape, dtype)) in enumerate(zip(handles, tensors, specs)):
                assert bps.synchronize(handle) is tensor
                assert_equal(tensor, expected(shape, dtype, average), f"grouped {names[i]} round {round_}")
    x = [torch.full((5,), float(r + 1)) for _ in range(3)]
    handles = bps.push_pull_group_async(x, op=bps.Sum, names=["group.fp16.0", "group.fp16.1", "group.fp16.2"],
                                        compression=bps.Compression.fp16)
    total = float(bps.size() * (bps.size() + 1) // 2)
    for handle, tensor in zip(handles, x):
        assert bps.synchronize(handle) is tensor
        assert_equal(tensor, torch.full((5,), total), "grouped fp16, in place")

    def first():   # the last rank has not pushed yet: the group is certainly in flight
        handles = bps.push_pull_group_async([torch.ones(2), torch.ones(3)], names=["group.busy.0", "group.busy.1"])
        expect_error(ValueError, "still in flight", lambda: bps.push_pull_group_async(
            [torch.ones(2)], names=["group.busy.0"]))
        for handle in handles:
            bps.synchronize(handle)

    def last():
        for handle in bps.push_pull_group_async([torch.ones(2), torch.ones(3)], names=["group.busy.0", "group.busy.1"]):
            bps.synchronize(handle)

    staggered(first, last)
    expect_error(ValueError, "2 tensors but 1 names", lambda: bps.push_pull_group_async(
        [torch.ones(2), torch.ones(2)], names=["group.len"]))


def process_info():
    assert bps.is_initialized()
    assert 0 <= bps.local_rank() < bps.local_size() <= bps.size()
    print(f"INFO rank={bps.rank()} size={bps.size()} local_rank={bps.local_rank()} "
          f"local_size={bps.local_size()}", flush=True)
    bps.barrier()


def telemetry_and_join():
    stamp, speed = bps.get_pushpull_speed()
    assert stamp > 0 and speed > 0, (stamp, speed)
    assert abs(stamp - time.time()) < 120, stamp
    if bps.rank() == bps.size() - 1:
        time.sleep(0.3)
    last = bps.join()
    assert last == bps.size() - 1, f"join() returned {last}, expected the late rank {bps.size() - 1}"


def main():
    bps.init()
    checks.run("process info", process_info)
    checks.run("dtypes x shapes x sum/average", dtypes_and_shapes)
    checks.run("async handles, poll, in-flight name, done callback", async_handles)
    checks.run("in-place variants", inplace_variants)
    checks.run("gradients through push_pull / allreduce", gradients)
    checks.run("compression and scaling", compression_and_scaling)
    checks.run("default names", default_names)
    checks.run("errors", errors)
    checks.run("grouped push_pull (fusion)", grouped_push_pull)
    checks.run("telemetry and join", telemetry_and_join)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
