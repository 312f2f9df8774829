"""torch.Tensor to byteps buffer: dtype mapping, checks, and host staging.

byteps-common reduces numpy arrays. A CPU tensor is handed over without a
copy: its DLPack capsule goes through the compiled bridge (``_C``), which
returns a memoryview over the tensor's own bytes, and numpy views that
memory (as 16-bit integers for bfloat16, which numpy lacks). The view keeps
the tensor's storage alive until byteps is done with it.

A single CUDA tensor's push_pull does not come here: byteps-common stages
it through pinned memory partition by partition (docs/gpu.md). Grouped
calls and the gathering collectives stage a tensor on another device here:
a synchronous copy to a CPU tensor, reduced there, and copied back by the
caller (:meth:`HostTensor.on_device`).

Example::

    host = HostTensor.of(tensor, "push_pull('grad')")
    host.array      # numpy view of host.host's bytes
    host.dtype      # DType.FLOAT32
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from byteps.common.dtypes import DType
from byteps.common.frontend.binding import dtype_table
from byteps.torch import _C

__all__ = ["HostTensor", "TorchStaging", "byteps_dtype", "check_tensor", "from_storage", "numpy_view", "shares_memory",
           "scaled"]

_DTYPES = dtype_table(lambda name: getattr(torch, name))
_SUPPORTED = ", ".join(str(dtype) for dtype in _DTYPES)


def byteps_dtype(dtype: torch.dtype, what: str) -> DType:
    """The byteps DType of a torch dtype; ValueError naming the supported ones."""
    found = _DTYPES.get(dtype)
    if found is None:
        raise ValueError(f"{what}: unsupported dtype {dtype}; byteps reduces {_SUPPORTED}")
    return found


def check_tensor(tensor: torch.Tensor, what: str) -> None:
    """TypeError/ValueError unless ``tensor`` is a dense, contiguous tensor with data.

    The dtype is checked later, on what is actually sent (a compressor may change it).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise ValueError(f"{what}: {tensor.layout} tensors are not supported; pass a dense tensor (.to_dense())")
    if tensor.device.type == "meta":
        raise ValueError(f"{what}: a tensor on the meta device has no data to reduce")
    if not tensor.is_contiguous():
        raise ValueError(
            f"{what}: the tensor is not contiguous (shape {list(tensor.shape)}, strides {list(tensor.stride())}); "
            "pass tensor.contiguous()")


def numpy_view(tensor: torch.Tensor, what: str) -> np.ndarray:
    """A numpy array over a contiguous CPU tensor's own memory (uint16 storage for bfloat16)."""
    capsule = tensor.detach().__dlpack__()
    try:
        view, code, shape = _C.from_dlpack(capsule)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    return np.frombuffer(view, dtype=DType(code).storage).reshape(shape)


def from_storage(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A torch tensor of ``dtype`` over a numpy array of its byteps storage, the inverse of :func:`numpy_view`
    (uint16 storage read as bfloat16); the memory is shared."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array).view(dtype)


def scaled(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """``tensor * factor`` in ``tensor``'s dtype, as Horovod scales: integers in float64, halves in float32.

    The same tensor when ``factor`` is 1; integer results are truncated toward zero.
    """
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_floating_point and tensor.element_size() >= 4:
        return tensor * factor
    wide = torch.float32 if tensor.dtype.is_floating_point else torch.float64
    return (tensor.to(wide) * factor).to(tensor.dtype)


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors use the same storage (and so must not be treated as independent)."""
    if a.device != b.device:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@dataclasses.dataclass
class HostTensor:
    """A tensor's bytes where byteps can read and write them.

    ``host`` is the tensor itself when it is on the CPU, else a CPU copy
    (``staged``); ``array`` is the numpy view byteps works on.
    """

    tensor: torch.Tensor
    host: torch.Tensor
    array: np.ndarray
    dtype: DType
    staged: bool

    @classmethod
    def of(cls, tensor: torch.Tensor, what: str) -> HostTensor:
        check_tensor(tensor, what)
        dtype = byteps_dtype(tensor.dtype, what)
        staged = tensor.device.type != "cpu"
        # Staging is a synchronous device-to-host copy (unverified without a GPU, see above).
        host = tensor.detach().to("cpu") if staged else tensor.detach()
        return cls(tensor=tensor, host=host, array=numpy_view(host, what), dtype=dtype, staged=staged)

    @property
    def layout(self) -> tuple:
        """(shape, dtype) of what is sent: picks the byteps tensor behind a name."""
        return tuple(self.host.shape), self.host.dtype

    def on_device(self) -> torch.Tensor:
        """The host bytes as a tensor on the original tensor's device (a copy if staged)."""
        return self.host.to(self.tensor.device) if self.staged else self.host


class TorchStaging:
    """torch tensors as the front's grouped push_pull sees them (:class:`byteps.common.frontend.group.Staging`)."""

    check = staticmethod(check_tensor)
    stage = staticmethod(HostTensor.of)

    @staticmethod
    def device(tensor: torch.Tensor) -> torch.device:
        return tensor.device

    @staticmethod
    def detach(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach()

    @staticmethod
    def on_device(staged: HostTensor) -> torch.Tensor:
        return staged.on_device()

    @staticmethod
    def write_back(staged: HostTensor, result: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if not shares_memory(result, target):
            with torch.no_grad():
                target.copy_(result)
        return target
