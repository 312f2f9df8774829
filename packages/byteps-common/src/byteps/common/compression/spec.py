"""BytePS's ``compression_params``: parsed once, checked, and carried as one value.

The dict a user gives ``DistributedOptimizer(..., compression_params=...)``
(BytePS's MXNet ``DistributedTrainer`` takes the same keys)::

    {"compressor": "onebit", "scaling": True, "ef": "vanilla", "momentum": "nesterov", "seed": 42}
    {"compressor": "topk", "k": 0.01, "ef": "vanilla"}
    {"compressor": "randomk", "k": 100, "seed": 7}
    {"compressor": "dithering", "k": 4, "partition": "natural", "normalize": "l2", "seed": 1}

becomes a :class:`CompressionSpec` through :func:`parse_compression_params`,
which refuses an unknown compressor or key, a ``k`` out of range, a seed of
0 (BytePS refuses it too; leave the seed out for a random one) with a
ValueError naming the parameter. ``momentum="nesterov"`` takes its factor
from the optimizer's own momentum, which the adapter then turns off, as
BytePS does. The part the servers need (not the momentum) travels with each
partition's INIT_KEY (:meth:`CompressionSpec.wire`), so every worker's
settings are compared there.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

__all__ = ["CompressionSpec", "parse_compression_params", "COMPRESSORS"]

COMPRESSORS = ("onebit", "topk", "randomk", "dithering")
KEYS = ("compressor", "ef", "momentum", "scaling", "k", "seed", "partition", "normalize", "fp16")
MAX_SEED = 2 ** 32 - 1
MAX_NATURAL_LEVELS = 31
MAX_LINEAR_LEVELS = 2 ** 15


@dataclasses.dataclass(frozen=True)
class CompressionSpec:
    """One tensor's compression, as BytePS defines it (see docs/compression.md)."""

    compressor: str  # onebit, topk, randomk, dithering
    k: Optional[float] = None  # topk/randomk: count (>= 1) or fraction (< 1); dithering: levels
    seed: Optional[int] = None  # randomk/dithering generator seed; None: a random one per process
    scaling: bool = False  # onebit: scale by mean |x| (else +-1)
    natural: bool = False  # dithering: natural (powers of two) levels, else linear
    l2: bool = False  # dithering: normalize by the l2 norm, else by max |x|
    ef: bool = False  # vanilla error feedback, on workers and servers
    momentum: Optional[float] = None  # Nesterov momentum factor on workers (from the optimizer), None: off
    fp16: bool = False  # cast to float16 before anything else (BytePS's intra-machine fp16)

    def wire(self) -> dict:
        """What a server needs, in INIT_KEY: every field but the workers' momentum and fp16."""
        fields = dataclasses.asdict(self)
        del fields["momentum"], fields["fp16"]
        return fields

    @classmethod
    def from_wire(cls, fields: Mapping[str, Any]) -> CompressionSpec:
        spec = cls(**fields)
        _check(spec)
        return spec

    def describe(self) -> str:
        parts = [self.compressor]
        if self.k is not None:
            parts.append(f"k={self.k:g}")
        if self.compressor == "onebit":
            parts.append(f"scaling={self.scaling}")
        if self.compressor == "dithering":
            parts += ["natural" if self.natural else "linear", "l2" if self.l2 else "max"]
        if self.seed is not None:
            parts.append(f"seed={self.seed}")
        if self.ef:
            parts.append("ef=vanilla")
        if self.momentum is not None:
            parts.append(f"nesterov mu={self.momentum:g}")
        return " ".join(parts)


def _text(params: Mapping[str, Any], key: str, choices: tuple, default: Optional[str]) -> Optional[str]:
    value = params.get(key)
    if value is None or value is False or value == "":
        return default
    if not isinstance(value, str):
        raise ValueError(f"compression_params[{key!r}] must be a string, one of {list(choices)}; got {value!r}")
    value = value.strip().lower()  # BytePS lowercases its string parameters
    if value not in choices:
        raise ValueError(f"compression_params[{key!r}] = {value!r} is not one of {list(choices)}")
    return value


def _flag(params: Mapping[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    if value is None or isinstance(value, bool):
        return bool(value)
    raise ValueError(f"compression_params[{key!r}] must be True or False, got {value!r}")


def parse_compression_params(params: Optional[Mapping[str, Any]],
                             momentum: Optional[float] = None) -> Optional[CompressionSpec]:
    """The CompressionSpec of BytePS's ``compression_params`` dict; None when it asks for nothing.

    ``momentum`` is the optimizer's momentum factor, needed by
    ``"momentum": "nesterov"``. Raises ValueError naming the bad parameter.
    """
    if not params:
        return None
    if not isinstance(params, Mapping):
        raise ValueError(f"compression_params must be a dict, got {type(params).__name__}")
    unknown = sorted(set(params) - set(KEYS))
    if unknown:
        raise ValueError(f"compression_params: unknown key(s) {unknown}; known keys are {list(KEYS)}")
    compressor = _text(params, "compressor", COMPRESSORS, None)
    if compressor is None:
        if any(params.get(key) for key in ("ef", "momentum")):
            raise ValueError("compression_params: 'ef' and 'momentum' need a 'compressor' "
                             f"(one of {list(COMPRESSORS)})")
        # fp16 alone: BytePS casts to float16 and compresses nothing else.
        return CompressionSpec("none", fp16=True) if _flag(params, "fp16") else None
    ef = _text(params, "ef", ("vanilla",), None) == "vanilla"
    nesterov = _text(params, "momentum", ("nesterov",), None) == "nesterov"
    if nesterov and (momentum is None or not momentum > 0):
        raise ValueError("compression_params['momentum'] = 'nesterov' takes its factor from the optimizer's "
                         f"momentum, which is {momentum!r}: give the optimizer momentum > 0")
    k = params.get("k")
    if compressor != "onebit":
        if k is None:
            raise ValueError(f"compression_params['k'] is required by the {compressor!r} compressor")
        if isinstance(k, bool) or not isinstance(k, (int, float)):
            raise ValueError(f"compression_params['k'] must be a number, got {k!r}")
    elif k is not None:
        raise ValueError("compression_params['k'] does not apply to the 'onebit' compressor")
    seed = params.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"compression_params['seed'] must be an integer, got {seed!r}")
    spec = CompressionSpec(
        compressor=compressor,
        k=None if k is None else float(k),
        seed=seed,
        scaling=_flag(params, "scaling"),
        natural=_text(params, "partition", ("linear", "natural"), "linear") == "natural",
        l2=_text(params, "normalize", ("max", "l2"), "max") == "l2",
        ef=ef,
        momentum=float(momentum) if nesterov else None,
        fp16=_flag(params, "fp16"),
    )
    _check(spec)
    return spec


def _check(spec: CompressionSpec) -> None:
    if spec.compressor not in COMPRESSORS + ("none",):
        raise ValueError(f"compression_params['compressor'] = {spec.compressor!r} is not one of {list(COMPRESSORS)}")
    if spec.seed is not None and not 0 < spec.seed <= MAX_SEED:
        raise ValueError(f"compression_params['seed'] = {spec.seed} must be in 1..{MAX_SEED} "
                         "(BytePS refuses 0; leave the seed out for a random one)")
    k = spec.k
    if spec.compressor in ("topk", "randomk") and not (k is not None and k > 0 and k == k and k != float("inf")):
        raise ValueError(f"compression_params['k'] = {k!r} must be > 0: a count of elements per partition "
                         "(>= 1) or a fraction of them (< 1)")
    if spec.compressor == "dithering":
        top = MAX_NATURAL_LEVELS if spec.natural else MAX_LINEAR_LEVELS
        if k is None or k != int(k) or not 1 <= k <= top:
            raise ValueError(f"compression_params['k'] = {k!r}: dithering needs a whole number of levels in "
                             f"1..{top} ({'natural' if spec.natural else 'linear'} partition)")
