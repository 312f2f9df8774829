"""What this build of byteps has, in Horovod's words: ``mpi_built()``, ``nccl_built()``, ... and the timeline calls.

Horovod scripts (and Horovod's own tests) ask which controllers and
libraries Horovod was built with, to pick a code path. byteps answers
truthfully: it has no MPI, Gloo, NCCL, DDL, oneCCL, CUDA or ROCm build of
its own (workers talk to parameter servers over its own transport, and GPU
tensors are staged through host memory by the adapters), so every one of
them answers False (``nccl_built()`` answers 0, as Horovod does without NCCL).

Horovod's timeline (``start_timeline``/``stop_timeline``) has no byteps
counterpart yet: both raise NotImplementedError naming the replacement to
use meanwhile (docs/horovod-compatibility.md).

Example::

    if not hvd.nccl_built():
        ...  # the CPU path
"""

from __future__ import annotations

from byteps.common.handle import PushPullError

__all__ = ["mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled", "nccl_built",
           "ddl_built", "ccl_built", "cuda_built", "rocm_built", "HorovodInternalError",
           "start_timeline", "stop_timeline"]

#: What Horovod raises when a collective fails because the job broke; here every failed byteps op.
HorovodInternalError = PushPullError


def mpi_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    return False


def gloo_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built() -> int:
    return 0


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Not available yet: raises NotImplementedError (Horovod writes a Chrome trace here)."""
    raise NotImplementedError(
        f"start_timeline({file_path!r}): byteps has no timeline yet; per-op timing is available from "
        "get_pushpull_speed() and BYTEPS_LOG_LEVEL=DEBUG (docs/horovod-compatibility.md)")


def stop_timeline() -> None:
    """Not available yet: raises NotImplementedError, as :func:`start_timeline` does."""
    raise NotImplementedError("stop_timeline(): byteps has no timeline yet (docs/horovod-compatibility.md)")
