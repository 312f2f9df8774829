"""How evenly each key-to-server assignment spreads real models' gradient bytes.

For ResNet-50, VGG-16 and BERT-base (float32 gradients, shapes from
``cluster/workloads.py``) cut at BYTEPS_PARTITION_BYTES, prints the busiest
server's bytes over the mean for: the old round-robin from the tensor id,
BytePS's hashes (djb2, sdbm, built_in) and the balanced assignment. 1.00 is
perfect; the step time of a bandwidth-bound job grows with the busiest server.
Tensor ids follow declaration order, which in the torch adapters is the
parameters' order (forward); ``--order backward`` gives ids in gradient order.
No network, no processes: a second or two.

    python benchmarks/server_balance.py [--order forward|backward] [--partition-bytes 4096000]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
from typing import Callable, Dict, List, Sequence, Tuple

from byteps.common.partition import PartitionPlan
from byteps.common.server_assignment import HASH_FNS, ServerAssigner

MODELS = ("resnet50", "vgg16", "bert-base")
SERVERS = (2, 4, 8)
METHODS = ("round-robin",) + HASH_FNS + ("balanced",)


def load_workloads():
    """benchmarks/cluster/workloads.py, loaded by path (it is not an installed module)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster", "workloads.py")
    spec = importlib.util.spec_from_file_location("byteps_bench_workloads", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tensor_sizes(model: str, order: str = "forward") -> List[int]:
    """Bytes of each float32 gradient of ``model``, in declaration (``forward``) or gradient order."""
    shapes = load_workloads().gradient_shapes(model)  # backward order
    sizes = [4 * math.prod(shape) for _, shape in shapes]
    return sizes if order == "backward" else sizes[::-1]


def server_bytes(sizes: Sequence[int], num_servers: int, method: str, partition_bytes: int) -> List[int]:
    """Bytes per server when tensors 0, 1, ... of ``sizes`` are placed by ``method``."""
    if method == "round-robin":
        load = [0] * num_servers
        for tensor_id, nbytes in enumerate(sizes):
            for part in PartitionPlan.build(tensor_id, nbytes, 4, partition_bytes, num_servers).partitions:
                load[part.server] += part.nbytes
        return load
    if method == "balanced":
        assigner = ServerAssigner(num_servers, partition_bytes, "balanced")
    else:
        assigner = ServerAssigner(num_servers, partition_bytes, "hash", method)
    for tensor_id, nbytes in enumerate(sizes):
        assigner.plan(tensor_id, nbytes, 4)
    return assigner.load()


def imbalance(load: Sequence[int]) -> float:
    """Busiest server's bytes over the mean (1.0 = even)."""
    return max(load) * len(load) / sum(load)


def table(order: str, partition_bytes: int) -> Dict[Tuple[str, int], Dict[str, float]]:
    out: Dict[Tuple[str, int], Dict[str, float]] = {}
    for model in MODELS:
        sizes = tensor_sizes(model, order)
        for k in SERVERS:
            out[model, k] = {m: imbalance(server_bytes(sizes, k, m, partition_bytes)) for m in METHODS}
    return out


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--order", choices=("forward", "backward"), default="forward")
    parser.add_argument("--partition-bytes", type=int, default=4096000)
    args = parser.parse_args(list(argv) or None)
    fmt: Callable[[float], str] = "{:.3f}".format
    print(f"busiest server / mean, tensor ids in {args.order} order, "
          f"BYTEPS_PARTITION_BYTES={args.partition_bytes}\n")
    print("| model | servers | " + " | ".join(METHODS) + " |")
    print("|---|---:|" + "---:|" * len(METHODS))
    for (model, k), row in table(args.order, args.partition_bytes).items():
        print(f"| {model} | {k} | " + " | ".join(fmt(row[m]) for m in METHODS) + " |")


if __name__ == "__main__":
    main()
