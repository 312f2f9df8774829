"""What this build of byteps has, in Horovod's words: ``mpi_built()``, ``nccl_built()``, ... and the timeline calls.

Horovod scripts (and Horovod's own tests) ask which controllers and
libraries Horovod was built with, to pick a code path. byteps answers
truthfully: it has no MPI, Gloo, NCCL, DDL, oneCCL, CUDA or ROCm build of
its own (workers talk to parameter servers over its own transport, and GPU
tensors are staged through host memory by the adapters), so every one of
them answers False (``nccl_built()`` answers 0, as Horovod does without NCCL).

Horovod's timeline (``start_timeline``/``stop_timeline``) records rank
0's push_pulls between the two calls into the file, in the format of
byteps' own timeline (docs/timeline.md), as Horovod's coordinator writes
its timeline alone.

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
    """Horovod's dynamic timeline: rank 0 traces its push_pulls into ``file_path`` until :func:`stop_timeline`.

    The trace is byteps' timeline format (docs/timeline.md), written at
    :func:`stop_timeline` (or shutdown). ``mark_cycles`` is accepted and
    ignored (byteps has no negotiation cycles to mark).
    """
    from byteps.common import api

    if not file_path:
        raise ValueError("start_timeline: file_path must not be empty")
    if not api.is_initialized():
        raise ValueError("start_timeline: call init() first")
    if api.rank() == 0:
        api.worker().start_timeline(file_path)


def stop_timeline() -> None:
    """End :func:`start_timeline`'s recording and write the file (rank 0)."""
    from byteps.common import api

    if api.is_initialized():
        api.worker().stop_timeline()
