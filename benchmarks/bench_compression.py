"""Compression kernels against numpy doing the same work, in the same run.

For each of BytePS's compressors (docs/compression.md) the C++ kernel of
byteps.common._C and a vectorised numpy version of the same definition
compress (and decompress) one partition of float32 gradients; the figure
is GB/s of dense input (decompress: of dense output), median of
``--repeats`` runs, and the ratio kernel/numpy. The numpy versions skip
what numpy cannot do cheaply (randomk and dithering draw from numpy's own
generator, not BytePS's xorshift128+; topk's output is not index-sorted),
so they are a generous baseline. Then error feedback's update
e = p - D(C(p)) two ways, in the same run: the two passes it took before
the kernels fused it (compress; decompress into e; np.subtract) against
one compress call with ``error=``, in CPU ms per MB of dense input. The
last rows time a worker's whole COMPRESS stage with error feedback and
Nesterov momentum (WorkerPartition.compress), fused and with the two-pass
update, and give CPU seconds per MB compressed, from which the compression
cost on other machines can be estimated.

    python benchmarks/bench_compression.py [--mb 4] [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from byteps.common import _C
from byteps.common.compression import CompressionSpec, PartitionCodec, WorkerPartition
from byteps.common.dtypes import DType

F32 = int(DType.FLOAT32)


def _median_seconds(run: Callable[[], object], repeats: int) -> float:
    run()  # warm caches and allocations
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class TwoPassCodec:
    """A PartitionCodec whose error update is the one before the fused kernels: compress, then
    decompress into the error and np.subtract."""

    def __init__(self, codec: PartitionCodec) -> None:
        self.codec, self.nbytes = codec, codec.nbytes

    def compress(self, dense: np.ndarray, out: np.ndarray, error: Optional[np.ndarray] = None) -> None:
        self.codec.compress(dense, out)
        if error is not None:
            self.codec.decompress(out, error)
            np.subtract(dense, error, out=error)

    def decompress(self, compressed, dense: np.ndarray) -> None:
        self.codec.decompress(compressed, dense)


def _numpy_cases(x: np.ndarray, k: int, levels: int) -> Dict[str, Callable[[], object]]:
    rng = np.random.default_rng(1)
    n = x.size

    def onebit():
        scale = np.float32(np.abs(x).mean())
        return np.packbits(x < 0), scale

    def topk():
        chosen = np.argpartition(np.abs(x), n - k)[n - k:]
        return chosen.astype(np.uint32), x[chosen]

    def randomk():
        chosen = rng.integers(0, n, k)
        return chosen.astype(np.uint32), x[chosen]

    def dithering():
        scale = np.abs(x).max()
        u = np.abs(x) / scale * levels
        low = np.floor(u)
        q = low + (rng.random(n, dtype=np.float32) < (u - low))
        fields = (q.astype(np.uint8) << 1) | np.signbit(x).astype(np.uint8)
        return np.bitwise_or(fields[0::2], fields[1::2] << 4), np.float32(scale)

    packed = np.packbits(x < 0)

    def onebit_decompress():
        signs = np.unpackbits(packed)[:n]
        return np.where(signs, np.float32(-1), np.float32(1))

    return {"onebit": onebit, "topk": topk, "randomk": randomk, "dithering": dithering,
            "onebit decompress": onebit_decompress}


def _kernel_cases(x: np.ndarray, k: int, levels: int) -> Dict[str, Callable[[], object]]:
    n = x.size
    state = np.array([7, 7], np.uint64)
    onebit_out = np.empty(_C.onebit_compressed_nbytes(n, F32), np.uint8)
    sparse_out = np.empty(_C.sparse_compressed_nbytes(k, F32), np.uint8)
    dithering_out = np.empty(_C.dithering_compressed_nbytes(n, levels), np.uint8)
    dense = np.empty_like(x)
    _C.onebit_compress(x, onebit_out, F32, False)
    return {
        "onebit": lambda: _C.onebit_compress(x, onebit_out, F32, True),
        "topk": lambda: _C.topk_compress(x, sparse_out, F32, k),
        "randomk": lambda: _C.randomk_compress(x, sparse_out, F32, k, state),
        "dithering": lambda: _C.dithering_compress(x, dithering_out, F32, levels, False, False, state),
        "onebit decompress": lambda: _C.onebit_decompress(onebit_out, dense, F32),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=4.0, help="partition size in MB of float32")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--k-fraction", type=float, default=0.01, help="topk/randomk's k as a fraction")
    parser.add_argument("--levels", type=int, default=4, help="dithering levels (linear, max)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    n = int(args.mb * 1e6) // 4
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    k = max(1, int(args.k_fraction * n))
    gigabytes = x.nbytes / 1e9
    rows: List[dict] = []
    ours, theirs = _kernel_cases(x, k, args.levels), _numpy_cases(x, k, args.levels)
    print(f"one partition of {x.nbytes / 1e6:.1f} MB float32, k = {k}, dithering {args.levels} levels; "
          f"median of {args.repeats}")
    print(f"{'kernel':<20}{'byteps GB/s':>12}{'numpy GB/s':>12}{'ratio':>8}")
    for name in ours:
        kernel_s, numpy_s = _median_seconds(ours[name], args.repeats), _median_seconds(theirs[name], args.repeats)
        row = {"kernel": name, "byteps_gb_s": gigabytes / kernel_s, "numpy_gb_s": gigabytes / numpy_s,
               "ratio": numpy_s / kernel_s}
        rows.append(row)
        print(f"{name:<20}{row['byteps_gb_s']:>12.2f}{row['numpy_gb_s']:>12.2f}{row['ratio']:>8.2f}")

    specs = {
        "onebit": {"compressor": "onebit", "scaling": True},
        "topk": {"compressor": "topk", "k": args.k_fraction},
        "randomk": {"compressor": "randomk", "k": args.k_fraction, "seed": 3},
        "dithering": {"compressor": "dithering", "k": float(args.levels), "seed": 3},
    }
    megabytes = x.nbytes / 1e6
    print("\nerror feedback's e = p - D(C(p)): compress + decompress + np.subtract, against the fused kernel:")
    print(f"{'compressor':<20}{'two-pass ms/MB':>16}{'fused ms/MB':>13}{'ratio':>8}")
    for name, params in specs.items():
        codec = PartitionCodec(CompressionSpec(**params, ef=True), DType.FLOAT32, n)
        two_pass, out, error = TwoPassCodec(codec), np.empty(codec.nbytes, np.uint8), np.zeros_like(x)
        two_pass_s = _median_seconds(functools.partial(two_pass.compress, x, out, error), args.repeats)
        fused_s = _median_seconds(functools.partial(codec.compress, x, out, error), args.repeats)
        row = {"error_feedback": name, "two_pass_ms_per_mb": 1e3 * two_pass_s / megabytes,
               "fused_ms_per_mb": 1e3 * fused_s / megabytes, "ratio": two_pass_s / fused_s}
        rows.append(row)
        print(f"{name:<20}{row['two_pass_ms_per_mb']:>16.3f}{row['fused_ms_per_mb']:>13.3f}{row['ratio']:>8.2f}")

    print("\nthe worker's COMPRESS stage (prescale, Nesterov, error feedback, codec, error update), "
          "with the error update fused and in two passes:")
    print(f"{'compressor':<20}{'GB/s':>8}{'ms per MB':>11}{'two-pass GB/s':>15}{'ratio':>8}{'fewer bytes':>13}")
    for name, params in specs.items():
        spec = CompressionSpec(**params, ef=True, momentum=0.9)
        worker, two_pass_worker = WorkerPartition(spec, DType.FLOAT32, n), WorkerPartition(spec, DType.FLOAT32, n)
        two_pass_worker.codec = TwoPassCodec(two_pass_worker.codec)
        seconds = _median_seconds(functools.partial(worker.compress, x.view(np.uint8), 0.1, 0.5), args.repeats)
        two_pass_s = _median_seconds(functools.partial(two_pass_worker.compress, x.view(np.uint8), 0.1, 0.5),
                                     args.repeats)
        sent = PartitionCodec(spec, DType.FLOAT32, n).nbytes
        row = {"stage": name, "gb_s": gigabytes / seconds, "cpu_s_per_mb": seconds / megabytes,
               "two_pass_gb_s": gigabytes / two_pass_s, "ratio": two_pass_s / seconds,
               "ratio_of_bytes": x.nbytes / sent}
        rows.append(row)
        print(f"{name:<20}{row['gb_s']:>8.2f}{1e3 * row['cpu_s_per_mb']:>11.3f}{row['two_pass_gb_s']:>15.2f}"
              f"{row['ratio']:>8.2f}{row['ratio_of_bytes']:>12.1f}x")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
