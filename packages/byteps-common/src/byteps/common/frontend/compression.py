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


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (the context is the original dtype); other dtypes as they are."""

    binding: ClassVar[TensorBinding]

    @classmethod
    def compress(cls, tensor: Any) -> Tuple[Any, Any]:  # type: ignore[override]
        binding = cls.binding
        dtype = binding.dtype(tensor)
        if binding.is_floating(tensor) and dtype != binding.float16:
            return binding.cast(tensor, binding.float16), dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:  # type: ignore[override]
        return tensor if ctx is None else cls.binding.cast(tensor, ctx)


class BF16Compressor(Compressor):
    """Sends float32 and float64 tensors as bfloat16 (the context is the original dtype); others as they are."""

    binding: ClassVar[TensorBinding]

    @classmethod
    def compress(cls, tensor: Any) -> Tuple[Any, Any]:  # type: ignore[override]
        binding = cls.binding
        dtype = binding.dtype(tensor)
        if binding.is_floating(tensor) and dtype not in (binding.float16, binding.bfloat16):
            return binding.cast(tensor, binding.bfloat16), dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:  # type: ignore[override]
        return tensor if ctx is None else cls.binding.cast(tensor, ctx)


def compression_for(binding: TensorBinding, module: str = __name__) -> type:
    """The ``Compression`` namespace of one framework: ``none``, ``fp16``, and ``bf16`` where it has bfloat16."""
    members = {"none": NoneCompressor, "__module__": module,
               "fp16": type("FP16Compressor", (FP16Compressor,), {"binding": binding, "__module__": module}),
               "__doc__": "The available compressors: Horovod's ``Compression.none``, ``Compression.fp16``, "
                          "and ``Compression.bf16`` where the framework has bfloat16."}
    if binding.bfloat16 is not None:
        members["bf16"] = type("BF16Compressor", (BF16Compressor,), {"binding": binding, "__module__": module})
    return type("Compression", (), members)
