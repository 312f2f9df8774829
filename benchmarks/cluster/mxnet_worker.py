"""One MXNet KVStore (dist_sync, ps-lite) worker of the cluster benchmark.

The parameter server BytePS grew out of, with the same server hosts. Runs
in MXNet's own venv (mxnet 1.9.1 needs numpy < 1.24). Each round starts at
a kvstore barrier, pushes every gradient, then pulls every sum, as MXNet's
trainer does. Arrays above MXNET_KVSTORE_BIGARRAY_BOUND elements (default
1e6) are sliced over all servers by ps-lite.

Servers and the scheduler are this file too: with DMLC_ROLE=server or
scheduler, ``import mxnet`` runs that role and exits.
"""

from __future__ import annotations

import argparse
import os
import time

import mxnet as mx  # with DMLC_ROLE=server/scheduler this runs the role and exits
from timing import now, write_result
from workloads import gradient_shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    kv = mx.kv.create("dist_sync")
    rank, size = kv.rank, kv.num_workers
    assert size == int(os.environ["DMLC_NUM_WORKER"])
    shapes = gradient_shapes(args.workload)
    keys = list(range(len(shapes)))
    grads = [mx.nd.full(shape, rank + 1, dtype="float32") for _, shape in shapes]
    kv.init(keys, [mx.nd.zeros(shape, dtype="float32") for _, shape in shapes])
    expected = float(sum(range(1, size + 1)))

    times, starts = [], []
    for i in range(args.warmup + args.repeats):
        kv._barrier()
        wall, start = time.time(), now()
        kv.push(keys, grads)
        kv.pull(keys, out=grads)
        mx.nd.waitall()
        elapsed = now() - start
        if i >= args.warmup:
            times.append(elapsed)
            starts.append(wall)
        if i == 0:
            for g in grads:
                got = g.asnumpy().ravel()
                if abs(got[0] - expected) > 1e-3 * expected or abs(got[-1] - expected) > 1e-3 * expected:
                    raise SystemExit(f"push/pull gave {got[:4]}, expected {expected}")
            for g in grads:  # back to rank + 1, so later rounds move the same values
                g[:] = rank + 1
            mx.nd.waitall()
    write_result(args.out, {"rank": rank, "times": times, "starts": starts})
    print(f"rank {rank}: {args.workload} rounds " + " ".join(f"{t:.3f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
