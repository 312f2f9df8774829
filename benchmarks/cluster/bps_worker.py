"""One byteps worker of the cluster benchmark: push_pull a workload's gradients, time each round.

Started by the rig on its host with the role environment (DMLC_ROLE=worker,
DMLC_WORKER_ID, DMLC_PS_ROOT_URI, ..., DMLC_INTERFACE=eth0). Each round
starts at a barrier, push_pulls every gradient of the workload at once
(averaged, as training does) and ends when the last one is back. The first
round is checked against the exact average (also with ``--compression-params``:
onebit with scaling sends a constant tensor exactly).

``--api`` picks the path: ``common`` (numpy arrays through byteps.common,
in place), ``torch`` (torch tensors, ``push_pull_async_inplace``) or
``torch-outofplace`` (``push_pull_async``: each result a new tensor).

``--op allgather|reducescatter`` times that collective of byteps.torch
instead (Horovod's ``hvd.allgather`` / ``hvd.reducescatter(op=Sum)``) on
the workload's single tensor (``100MB``), checking every round
(:mod:`collectives`).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from timing import now, role_env, write_result
from workloads import TENSOR_100MB, gradient_shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", required=True, help="result JSON of this worker")
    parser.add_argument("--trace", help="write per-partition timestamps here (stage_probe)")
    parser.add_argument("--compression-params", type=json.loads, default=None,
                        help="BytePS's compression_params (JSON)")
    parser.add_argument("--backward-ms", type=float, default=0.0,
                        help="spread the submissions over this long, in backward order, each after a share "
                             "proportional to its size (an emulated backward pass); 0: all at once")
    parser.add_argument("--api", choices=("common", "torch", "torch-outofplace"), default="common",
                        help="byteps.common on numpy arrays, or byteps.torch in place or out of place")
    parser.add_argument("--op", choices=("allreduce", "allgather", "reducescatter"), default="allreduce",
                        help="allreduce: push_pull every gradient; else that byteps.torch collective (100MB only)")
    args = parser.parse_args()
    if args.op != "allreduce":
        return collective_rounds(args)
    if args.trace:
        import stage_probe

        stage_probe.install(args.trace)
    import byteps.common as bps
    from byteps.common.api import worker  # byteps.common.worker is also the submodule's name

    role = role_env()
    if args.api == "common":
        bps.init()
        submit = bps.push_pull_async
    else:
        import torch

        import byteps.torch as bps_torch

        bps_torch.init()
        submit = bps_torch.push_pull_async_inplace if args.api == "torch" else bps_torch.push_pull_async
    assert bps.rank() == role["rank"] and bps.size() == role["size"], (bps.rank(), bps.size(), role)
    grads = [(name, np.full(shape, role["rank"] + 1, dtype=np.float32)) for name, shape in
             gradient_shapes(args.workload)]
    if args.api == "common":
        # Declared in forward order, as DistributedOptimizer declares a model's gradients (their priority: the
        # first layer's is needed first by the next forward pass); pushed in backward order, as they come.
        for name, array in reversed(grads):
            bps.declare(name, nbytes=array.nbytes, itemsize=array.itemsize)
    else:
        grads = [(name, torch.from_numpy(array)) for name, array in grads]
    expected = np.float32(sum(range(1, role["size"] + 1))) / np.float32(role["size"])

    total = sum(array.nbytes for _, array in grads)
    pauses = [args.backward_ms / 1000 * array.nbytes / total for _, array in grads]
    options = {"compression_params": args.compression_params} if args.compression_params else {}
    results = [array for _, array in grads]  # in place: the gradients; out of place: the last round's results

    def one_round():
        bps.barrier()
        wall, start = time.time(), now()
        handles = []
        for (name, array), pause in zip(grads, pauses):
            if pause:
                time.sleep(pause)
            handles.append(submit(array, name=name, average=True, **options))
        submitted = now()
        sync = bps.synchronize if args.api == "common" else bps_torch.synchronize
        results[-1] = sync(handles[-1])  # the first layer's gradients: when could the next forward pass begin?
        first = now() - submitted  # from the end of the backward pass
        for index, handle in enumerate(handles[:-1]):
            results[index] = sync(handle)
        return now() - start, wall, first

    times, starts, firsts = [], [], []
    for i in range(args.warmup + args.repeats):
        elapsed, started, first = one_round()
        if i >= args.warmup:
            times.append(elapsed)
            starts.append(started)
            firsts.append(first)
        if i == 0:
            for (name, _), result in zip(grads, results):  # the average of rank+1 over ranks, exact in float32
                array = result if args.api == "common" else result.numpy()
                if not np.allclose(array, expected, rtol=1e-6):
                    raise SystemExit(f"push_pull({name!r}) gave {array.ravel()[:4]}, expected {expected}")
    write_result(args.out, {"rank": role["rank"], "times": times, "starts": starts, "first_layer": firsts,
                            "bytes_sent": worker().bytes_sent, "bytes_received": worker().bytes_received})
    print(f"rank {role['rank']}: {args.workload} rounds " + " ".join(f"{t:.3f}" for t in times), flush=True)
    bps.shutdown()


def collective_rounds(args: argparse.Namespace) -> None:
    """--op allgather|reducescatter: each round one byteps.torch collective of the 100 MB tensor, checked."""
    from collectives import byteps_call, check, inputs

    import byteps.torch as hvd
    from byteps.common.api import worker

    if args.workload != "100MB":
        raise SystemExit(f"--op {args.op} times the 100MB workload only, not {args.workload}")
    hvd.init()
    role = role_env()
    tensor = inputs(args.op, TENSOR_100MB, role["rank"], role["size"])
    times, starts = [], []
    for i in range(args.warmup + args.repeats):
        hvd.barrier()
        wall, start = time.time(), now()
        out = byteps_call(hvd, args.op, tensor)
        elapsed = now() - start
        check(args.op, out, TENSOR_100MB, role["size"])
        if i >= args.warmup:
            times.append(elapsed)
            starts.append(wall)
    write_result(args.out, {"rank": role["rank"], "times": times, "starts": starts,
                            "bytes_sent": worker().bytes_sent, "bytes_received": worker().bytes_received})
    print(f"rank {role['rank']}: {args.op} 100MB rounds " + " ".join(f"{t:.3f}" for t in times), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
