"""Gradient compression with Horovod's Compressor interface, for any framework.

A compressor turns a tensor into what is sent (``compress`` returns the
tensor to push_pull and a context) and back (``decompress(tensor, ctx)``).
``Compression.fp16`` sends floating-point tensors as float16, halving the
bytes of float32 ones; the servers sum float16 in float32 and round once.
Integer tensors and float16 ones go as they are. ``Compression.bf16``
(beyond Horovod and BytePS; where the framework has bfloat16) sends
float32 and float64 tensors as bfloat16: float32's range with 8 bits of
precision, so large gradients never overflow as they can in float16.

:class:`Compressor` and :class:`NoneCompressor` need nothing from the
framework; an adapter gets its ``FP16Compressor`` and ``Compression`` from
:func:`compression_for` with its :class:`~byteps.common.frontend.binding.TensorBinding`::

    Compression = compression_for(TORCH)
    bps.allreduce(grad, compression=Compression.fp16)
"""

from __future__ import annotations

from typing import Any, ClassVar, Tuple

from byteps.common.frontend.binding import TensorBinding

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "compression_for"]


class Compressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)``, ``decompress(tensor, ctx) -> tensor``."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is."""

    @staticmethod
    def compress(tensor: Any) -> Tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class _CastCompressor(Compressor):
    """Sends floating-point tensors cast to a 16-bit type (the context is the original dtype)."""

    binding: ClassVar[TensorBinding]

    @classmethod
    def _casts(cls, dtype: Any) -> Any:
        """The dtype a tensor of ``dtype`` is sent as, or None to send it as it is."""
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor: Any) -> Tuple[Any, Any]:  # type: ignore[override]
        binding = cls.binding
        dtype = binding.dtype(tensor)
        target = cls._casts(dtype) if binding.is_floating(tensor) else None
        if target is not None:
            return binding.cast(tensor, target), dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:  # type: ignore[override]
        return tensor if ctx is None else cls.binding.cast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16; other dtypes as they are."""

    @classmethod
    def _casts(cls, dtype: Any) -> Any:
        return None if dtype == cls.binding.float16 else cls.binding.float16


class BF16Compressor(_CastCompressor):
    """Sends float32 and float64 tensors as bfloat16; 16-bit floats and other dtypes as they are."""

    @classmethod
    def _casts(cls, dtype: Any) -> Any:
        return None if dtype in (cls.binding.float16, cls.binding.bfloat16) else cls.binding.bfloat16


def compression_for(binding: TensorBinding, module: str = __name__) -> type:
    """The ``Compression`` namespace of one framework: ``none``, ``fp16``, and ``bf16`` where it has bfloat16."""
    members = {"none": NoneCompressor, "__module__": module,
               "fp16": type("FP16Compressor", (FP16Compressor,), {"binding": binding, "__module__": module}),
               "__doc__": "The available compressors: Horovod's ``Compression.none``, ``Compression.fp16``, "
                          "and ``Compression.bf16`` where the framework has bfloat16."}
    if binding.bfloat16 is not None:
        members["bf16"] = type("BF16Compressor", (BF16Compressor,), {"binding": binding, "__module__": module})
    return type("Compression", (), members)
