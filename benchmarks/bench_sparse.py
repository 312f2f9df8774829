"""A CTR model's training step through five paths, in one run: row-sparse, dense, gather, DDP-gloo, server-held.

The workload (issue 44's, scaled to this machine): 26 categorical fields,
each field's ids drawn from a power law over its own range of one
embedding table (``--rows`` rows in all, ``--dim`` wide, ``sparse=True``),
the 26 embeddings concatenated into an MLP (416 -> 256 -> 128 -> 1), and
labels from a hidden rule (a fixed random weight per id and a logistic
draw), so the logloss means something. Every rank trains on batches of its
own (``--batch`` per rank), the same batches in every mode, with SGD.

The paths, each a job of ``--workers`` processes on 127.0.0.1:

* ``row-sparse``: ``byteps.torch.DistributedOptimizer`` with ``--servers``
  servers (reached over TCP, ``BYTEPS_ENABLE_IPC=0``, as on hosts of their
  own); the embedding's gradient goes as the (ids, rows) it touched
  (docs/sparse.md);
* ``dense``: the same with ``sparse_as_dense=True``: the whole table's
  gradient through the servers, as BytePS does;
* ``gather``: the same job, the embedding's gradient gathered as Horovod
  does (every rank's indices and values to every rank;
  ``BYTEPS_ROW_SPARSE=0``, nothing else changes);
* ``ddp-gloo``: ``torch.nn.parallel.DistributedDataParallel`` over gloo,
  the same sparse embedding (gloo's sparse allreduce);
* ``held``: the table lives on the servers (``byteps.torch.ServerEmbedding``,
  SGD there): each step looks up the batch's rows and pushes their
  gradients; the workers hold the MLP only.

Every path's table starts from the same rows (``held_table.initial_rows``,
standard normal as ``nn.Embedding``'s), so all of them compute the same
update. The report adds each job's worker resident memory at its end
(rank 0's RSS): the held path's workers never hold the table.

``--local-size L`` runs the byteps paths as ``--workers`` machines of L
processes each (``bpslaunch -np L``): a machine's ranks sum their rows (or
their dense gradients) inside it, through the local channel and shared
memory, which ``lo`` does not see, before anything goes to a server. The
DDP path has no machines, so it is left out there.

Each job times ``--steps`` steps after ``--warmup`` steps and reports the
median step time, the loopback bytes of the whole job per timed step per
worker machine (read from ``/proc/net/dev``: workers and servers share
``lo``, so this counts every byte the job moved between machines and
servers, sent and received), and the logloss
of the last step on rank 0 (the same in every mode up to summation order:
the paths compute the same update). Modes run in turns, ``--repeats``
times, and the report gives each mode's median over the repeats and its
ratio against ``row-sparse`` (> 1: row-sparse is faster).

    python benchmarks/bench_sparse.py [--workers 2] [--local-size 1] [--servers 2] [--rows 1000000] [--repeats 3]
                                      [--json out.json]

``--rig`` (as root) runs every path on the cluster rig instead
(``benchmarks/cluster/sparse_rig.py``): a network namespace per worker,
per server and for the scheduler, every NIC capped at ``--rate`` (500
Mbit/s), one worker process per host, the DDP path's gloo on the same
worker hosts; bytes are each worker's NIC (sent and received) per step,
the step the slowest worker's. ``--servers 2,4`` runs the byteps paths
once per server-host count. ``--smoke``: 2 workers, a small table, a few
seconds.

    sudo python benchmarks/bench_sparse.py --rig --workers 4 --servers 4 --repeats 3
    sudo python benchmarks/bench_sparse.py --rig --workers 4 --modes held --servers 2,4 --rate 100mbit
    sudo python benchmarks/bench_sparse.py --rig --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ("row-sparse", "dense", "gather", "ddp-gloo", "held")
FIELDS = 26


def nic_bytes(nic: str = "lo") -> tuple:
    """(sent, received) bytes of interface ``nic`` so far, in this process's network namespace."""
    with open("/proc/net/dev") as dev:
        for line in dev:
            name, _, fields = line.partition(":")
            if name.strip() == nic:
                return int(fields.split()[8]), int(fields.split()[0])
    raise RuntimeError(f"no interface {nic!r} in /proc/net/dev")


def loopback_bytes() -> int:
    """Bytes sent over ``lo`` so far (what it sends it also receives)."""
    return nic_bytes("lo")[0]


#: The table's start in every path: what a server-held table's rows start as (seed 0, standard normal).
HELD = dict(optimizer="sgd", seed=0, init_std=1.0)


def make_model(args: argparse.Namespace):
    import numpy as np
    import torch

    from byteps.common.held_table import HeldTable, initial_rows

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(FIELDS * args.dim, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    if args.mode == "held":
        import byteps.torch as bps

        embedding = bps.ServerEmbedding(args.rows, args.dim, name="ctr", lr=args.lr, **HELD)
    else:
        embedding = torch.nn.Embedding(args.rows, args.dim, sparse=True)
        start = initial_rows(HeldTable(lr=args.lr, **HELD), np.arange(args.rows), args.dim)
        embedding.weight.data = torch.from_numpy(start)
    return torch.nn.ModuleDict({"embedding": embedding, "mlp": mlp})


def batches(args: argparse.Namespace, rank: int, count: int):
    """``count`` (ids, labels) batches of this rank: field f's ids in its own range of rows, drawn from a
    power law (small ids hot), labels from a hidden per-id weight (hashed from the id: no array of the
    table's size on the workers)."""
    import numpy as np
    import torch

    from byteps.common.held_table import HeldTable, initial_rows

    per_field = args.rows // FIELDS
    hidden = HeldTable(seed=1, init_std=1.0)  # each id's hidden weight, from its id alone (no table of them)
    rng = np.random.default_rng(100 + rank)
    out = []
    for _ in range(count):
        local = np.minimum((per_field * rng.random((args.batch, FIELDS)) ** args.skew).astype(np.int64),
                           per_field - 1)
        ids = local + np.arange(FIELDS, dtype=np.int64) * per_field
        logits = initial_rows(hidden, ids.reshape(-1), 1).reshape(ids.shape).sum(axis=1) / np.sqrt(FIELDS)
        labels = (rng.random(args.batch) < 1 / (1 + np.exp(-logits))).astype(np.float32)
        out.append((torch.from_numpy(ids), torch.from_numpy(labels)))
    return out


def step_loss(model, ids, labels):
    import torch

    features = model["embedding"](ids).reshape(ids.shape[0], -1)
    logits = model["mlp"](features).squeeze(1)
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    if args.mode != "ddp-gloo":
        import byteps.torch as bps

        bps.init()
    model = make_model(args)
    if args.mode == "ddp-gloo":
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
        rank, barrier = dist.get_rank(), dist.barrier

        class Whole(torch.nn.Module):  # DDP hooks the gradients of the module it calls: the whole step's
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, ids, labels):
                return step_loss(self.inner, ids, labels)

        trained = torch.nn.parallel.DistributedDataParallel(Whole(model))
        optimizer = torch.optim.SGD(trained.parameters(), lr=args.lr)
        forward = trained
    else:
        rank, barrier = bps.rank(), bps.barrier
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                             named_parameters=model.named_parameters(),
                                             sparse_as_dense=args.mode == "dense")

        def forward(ids, labels):
            return step_loss(model, ids, labels)

    data = batches(args, rank, args.warmup + args.steps)
    times, loss = [], None
    for index, (ids, labels) in enumerate(data):
        if index == args.warmup:
            barrier()
            before, window_start = nic_bytes(args.nic), time.time()
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = forward(ids, labels)
        loss.backward()
        optimizer.step()
        if index >= args.warmup:
            times.append(time.perf_counter() - start)
    barrier()
    after, window_end = nic_bytes(args.nic), time.time()
    if rank == 0 or args.nic != "lo":  # on the rig every worker reports its own NIC
        with open("/proc/self/status") as status:  # resident now: what the worker holds, not a passing peak
            rss_mb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
        print("RESULT " + json.dumps({"rank": rank, "step_s": statistics.median(times), "times": times,
                                      "loopback_bytes": after[0] - before[0], "sent": after[0] - before[0],
                                      "received": after[1] - before[1], "window": [window_start, window_end],
                                      "logloss": float(loss), "rss_mb": rss_mb}), flush=True)
    if args.mode == "ddp-gloo":
        import torch.distributed as dist

        dist.destroy_process_group()
    else:
        bps.shutdown()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_mode(args: argparse.Namespace, mode: str) -> dict:
    script = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode, "--rows", str(args.rows),
              "--dim", str(args.dim), "--batch", str(args.batch), "--steps", str(args.steps),
              "--warmup", str(args.warmup), "--lr", str(args.lr), "--skew", str(args.skew)]
    with tempfile.TemporaryDirectory() as scratch:
        if mode == "ddp-gloo":
            port = free_port()
            procs = []
            for rank in range(args.workers):
                env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                           WORLD_SIZE=str(args.workers))
                procs.append(subprocess.Popen(script, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True, cwd=scratch))
            outputs = []
            try:
                for proc in procs:
                    outputs.append(proc.communicate(timeout=args.timeout)[0])
            finally:
                for proc in procs:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
            codes = [proc.returncode for proc in procs]
            output = "\n".join(outputs)
        else:
            launch = ["bpslaunch", "-q", "-np", str(args.local_size), "--workers", str(args.workers), "--servers",
                      args.servers, "--"]
            # Servers reached over TCP, as on machines of their own (no shared-memory shortcut to them); the
            # gather is Horovod's way, the row-sparse path switched off and nothing else.
            env = dict(os.environ, BYTEPS_ENABLE_IPC="0", BYTEPS_ROW_SPARSE="0" if mode == "gather" else "1")
            proc = subprocess.run(launch + script, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=args.timeout, cwd=scratch, env=env)
            codes, output = [proc.returncode], proc.stdout
    if any(codes):
        raise SystemExit(f"{mode} job failed ({codes}):\n{output[-4000:]}")
    line = next(line for line in output.splitlines() if "RESULT " in line)
    result = json.loads(line.split("RESULT ", 1)[1])
    result["bytes_per_worker_step"] = result["loopback_bytes"] / args.steps / args.workers
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--local-size", type=int, default=1, help="worker processes per machine (byteps paths)")
    parser.add_argument("--servers", default="2",
                        help="servers (on the rig: server hosts; a list such as 2,4 runs the byteps paths with each)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="embedding rows in all (26 fields)")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=512, help="examples per rank per step")
    parser.add_argument("--skew", type=float, default=3.0,
                        help="a field's id is range * u**skew (u uniform): higher, hotter small ids and more rows "
                             "shared between ranks (3: mild, most of a batch's rows its own)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("--rig", action="store_true",
                        help="run on the cluster rig (root): a host per worker and per server, NICs capped at --rate")
    parser.add_argument("--rate", default="500mbit", help="--rig: every NIC's cap, both ways (tc units)")
    parser.add_argument("--smoke", action="store_true",
                        help="a few seconds' check: 2 workers, 1 server, 20,000 rows, 3 steps, 1 repeat")
    parser.add_argument("--byteps-env", action="append", default=[], metavar="NAME=VALUE",
                        help="--rig: a byteps setting, e.g. BYTEPS_PARTITION_BYTES=65536 (repeatable)")
    parser.add_argument("--nic", default="lo", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.smoke:
        args.workers, args.servers, args.rows, args.batch, args.steps, args.warmup, args.repeats = \
            2, "1", 20_000, 64, 3, 1, 1
    modes = [mode for mode in args.modes.split(",") if mode and not (mode == "ddp-gloo" and args.local_size > 1)]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    if args.rig:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster"))
        import sparse_rig

        if args.local_size != 1:
            parser.error("--rig runs one worker process per host (--local-size 1)")
        try:
            counts = sparse_rig.parse_servers(args.servers)
        except ValueError as exc:
            parser.error(str(exc))
        runs = sparse_rig.run(args, modes, counts)
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"args": {k: v for k, v in vars(args).items() if k not in ("worker", "mode")},
                           "runs": runs}, out, indent=1)
        return
    if not args.servers.isdigit():
        parser.error("--servers: one count (a list is for --rig)")
    runs = {mode: [] for mode in modes}
    for repeat in range(args.repeats):
        for mode in modes:
            result = run_mode(args, mode)
            runs[mode].append(result)
            print(f"repeat {repeat} {mode:>10}: {result['step_s'] * 1e3:8.1f} ms/step, "
                  f"{result['bytes_per_worker_step'] / 1e6:8.2f} MB per machine per step, "
                  f"logloss {result['logloss']:.5f}, worker RSS {result['rss_mb']:.0f} MB", flush=True)
    print(f"\n{args.workers} worker machines of {args.local_size} process(es), {args.servers} servers, "
          f"{args.rows:,} rows x {args.dim}, "
          f"batch {args.batch} per rank, median of {args.repeats}:")
    base = statistics.median(run["step_s"] for run in runs[modes[0]])
    print(f"| path | step (ms) | MB per machine per step | {modes[0]} speed-up | logloss | worker RSS (MB) |")
    print("|---|---|---|---|---|---|")
    for mode in modes:
        step = statistics.median(run["step_s"] for run in runs[mode])
        moved = statistics.median(run["bytes_per_worker_step"] for run in runs[mode])
        loss = runs[mode][-1]["logloss"]
        rss = statistics.median(run["rss_mb"] for run in runs[mode])
        print(f"| {mode} | {step * 1e3:.1f} | {moved / 1e6:.2f} | {step / base:.2f}x | {loss:.5f} | {rss:.0f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": {k: v for k, v in vars(args).items() if k not in ("worker", "mode")}, "runs": runs},
                      out, indent=1)


if __name__ == "__main__":
    main()
