"""BytePS's gradient compression in plain numpy, written from its definition, for tests to compare against.

Each compressor is given as what a worker ends up with: ``roundtrip(x)`` =
decompress(compress(x)), with the random draws of randomk and dithering
from :class:`XorShift128Plus` (BytePS's generator, seeded ``a = b = seed``
and kept from round to round). :class:`ReferenceJob` runs whole rounds of
a job the way docs/compression.md defines them: each worker's momentum,
error feedback and codec, the server's sum, its error feedback and codec
again. float32 only, one partition per tensor; slow (Python loops) but
obvious. Nothing here imports byteps.

Example::

    job = ReferenceJob({"compressor": "onebit", "scaling": True, "ef": "vanilla"}, workers=2)
    average = job.round("w", [grad0, grad1], lr=0.1)
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np

__all__ = ["XorShift128Plus", "roundtrip", "ReferenceJob", "uncompressed_rounds"]

_MASK = (1 << 64) - 1
_TWO_64 = 18446744073709551616.0


class XorShift128Plus:
    """BytePS's random generator: state (a, b) = (seed, seed)."""

    def __init__(self, seed: int) -> None:
        self.a = self.b = int(seed)

    def next(self) -> int:
        t, s = self.a, self.b
        self.a = s
        t ^= (t << 23) & _MASK
        t ^= t >> 17
        t ^= s ^ (s >> 26)
        self.b = t
        return (t + s) & _MASK

    def bernoulli(self, p: float) -> bool:
        return float(self.next()) < p * _TWO_64


def _onebit(x: np.ndarray, scaling: bool) -> np.ndarray:
    scale = np.float32(np.abs(x.astype(np.float64)).sum() / x.size) if scaling else np.float32(1.0)
    return np.where(x < 0, -scale, scale).astype(np.float32)


def _sparse(x: np.ndarray, indices: Sequence[int]) -> np.ndarray:
    out = np.zeros_like(x)
    for i in indices:
        out[i] = x[i]
    return out


def _k(k: float, n: int) -> int:
    chosen = int(k) if k >= 1 else max(1, int(k * n))
    return max(1, min(chosen, n))


def _next_pow2(v: int) -> int:
    v -= 1
    for shift in (1, 2, 4, 8, 16):
        v |= v >> shift
    return (v + 1) & 0xFFFFFFFF


def _dithering(x: np.ndarray, levels: int, natural: bool, l2: bool, rng: XorShift128Plus) -> np.ndarray:
    if l2:
        scale = math.sqrt(float(np.sum((x * x).astype(np.float64))))
    else:
        scale = float(np.max(np.abs(x))) if x.size else 0.0
    top = 1 << (levels - 1) if natural else levels
    out = np.zeros_like(x)
    scale_f = np.float32(scale)
    for i, value in enumerate(x):
        a = np.float32(abs(value))
        if not scale > 0 or not math.isfinite(scale):
            rng.next()
            continue
        if natural:
            u = (float(a) / scale) * top
            floor = _next_pow2(int(math.ceil(u))) >> 1
            length = floor or 1
            q = floor + length * rng.bernoulli((u - floor) / length)
        else:
            u = np.float32((float(a) / scale) * levels)
            floor = np.float32(math.floor(u))
            q = int(floor) + rng.bernoulli(float(np.float32(u - floor)))
        if q:
            magnitude = np.float32(np.float32(q) * scale_f) / np.float32(top)
            out[i] = -magnitude if math.copysign(1.0, float(value)) < 0 else magnitude
    return out


def roundtrip(params: dict, x: np.ndarray, rng: Optional[XorShift128Plus]) -> np.ndarray:
    """decompress(compress(x)) for one partition of float32 ``x``; ``rng`` is consumed by randomk/dithering."""
    name = params["compressor"]
    if name == "onebit":
        return _onebit(x, bool(params.get("scaling")))
    if name == "topk":
        order = np.argsort(-np.abs(x), kind="stable")  # largest |x|, ties to the lower index
        return _sparse(x, order[:_k(params["k"], x.size)])
    if name == "randomk":
        return _sparse(x, [rng.next() % x.size for _ in range(_k(params["k"], x.size))])
    if name == "dithering":
        return _dithering(x, int(params["k"]), params.get("partition") == "natural",
                          params.get("normalize") == "l2", rng)
    raise ValueError(name)


class ReferenceJob:
    """Rounds of a compressed job: ``workers`` pushing machines, one server, every tensor one partition.

    ``size`` is the number of worker processes the average is over (default
    ``workers``); with several processes per machine, give :meth:`round` each
    machine's local sum (the local root compresses that).
    """

    def __init__(self, params: dict, workers: int, momentum: float = 0.0, size: Optional[int] = None) -> None:
        self.params, self.workers, self.mu = params, workers, np.float32(momentum)
        self.size = size or workers
        self.seed = params.get("seed")
        self.ef = params.get("ef") == "vanilla"
        self.nesterov = params.get("momentum") == "nesterov"
        self._state: Dict[str, dict] = {}

    def _tensor(self, name: str, size: int) -> dict:
        if name not in self._state:
            zeros = np.zeros(size, np.float32)
            def rng():  # onebit and topk draw nothing; randomk and dithering need a seed here
                return XorShift128Plus(self.seed) if self.seed is not None else None

            self._state[name] = {
                "rng": [rng() for _ in range(self.workers)],
                "server_rng": rng(),
                "error": [zeros.copy() for _ in range(self.workers)], "server_error": zeros.copy(),
                "momentum": [zeros.copy() for _ in range(self.workers)],
                "lr": [None] * self.workers, "server_lr": None,
            }
        return self._state[name]

    @staticmethod
    def _ratio(previous: Optional[float], current: float) -> np.float32:
        return np.float32(1.0 if not previous or not current else previous / current)

    def round(self, name: str, gradients: List[np.ndarray], lr: float) -> np.ndarray:
        """The averaged gradient every worker gets for one round of ``name``."""
        flat = [np.asarray(g, np.float32).ravel() for g in gradients]
        state = self._tensor(name, flat[0].size)
        total = None
        for w, g in enumerate(flat):
            p = (g * np.float32(1.0 / self.size)).astype(np.float32)
            if self.nesterov:
                m = state["momentum"][w]
                m[:] = p + self.mu * m
                p = (p + self.mu * m).astype(np.float32)
            if self.ef:
                p = (p + self._ratio(state["lr"][w], lr) * state["error"][w]).astype(np.float32)
                state["lr"][w] = lr
            sent = roundtrip(self.params, p, state["rng"][w])
            if self.ef:
                state["error"][w] = (p - sent).astype(np.float32)
            total = sent if total is None else (total + sent).astype(np.float32)
        if self.ef:
            total = (total + self._ratio(state["server_lr"], lr) * state["server_error"]).astype(np.float32)
            state["server_lr"] = lr
        answer = roundtrip(self.params, total, state["server_rng"])
        if self.ef:
            state["server_error"] = (total - answer).astype(np.float32)
        return answer.reshape(np.shape(gradients[0]))


def uncompressed_rounds(gradients: List[List[np.ndarray]], momentum: float = 0.0) -> List[np.ndarray]:
    """What each round gives a tensor that goes uncompressed: the plain average of the ranks' gradients
    (``gradients[rank][round]``), then BytePS's momentum after the pull, ``M = mu*(M + D); D = D + M``."""
    mu, answers = np.float32(momentum), []
    buffer = np.zeros_like(np.asarray(gradients[0][0], np.float32))
    for step in range(len(gradients[0])):
        total = np.asarray(gradients[0][step], np.float32)
        for rank in gradients[1:]:
            total = (total + np.asarray(rank[step], np.float32)).astype(np.float32)
        average = (total / np.float32(len(gradients))).astype(np.float32)
        if momentum:
            buffer = (mu * (buffer + average)).astype(np.float32)
            average = (average + buffer).astype(np.float32)
        answers.append(average)
    return answers
