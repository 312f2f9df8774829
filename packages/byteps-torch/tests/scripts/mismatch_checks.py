"""Worker script: ranks that disagree on a tensor's shape or dtype all get a clear error.

Run under bpslaunch (2 ranks). Rank 0 and the others push the same name with
another shape, then another dtype; every rank must see a PushPullError that
names both descriptions, and the job must go on working for other names.
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
    bps.shutdown()
    print("ALL OK 3", flush=True)


if __name__ == "__main__":
    main()
