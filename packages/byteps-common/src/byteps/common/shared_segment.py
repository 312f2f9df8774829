"""Named POSIX shared-memory segments for local aggregation, named per job.

Worker processes of one machine sum their tensors through one segment per
tensor (see :mod:`byteps.common.engine.local`). Names carry the job
id, so two jobs on one machine never collide (BytePS named its segments by
tensor key alone), and the worker machine, so simulated machines sharing a
kernel stay apart::

    /dev/shm/byteps-<job id>-m<worker id>-t<tensor id>

Each name lives only until every local process has mapped the segment:
the first partition's local root unlinks it then, and the kernel frees the
memory when the last mapping goes, also when processes are killed. A
process killed inside that short window can leave a name behind;
:func:`sweep` removes a job's leftovers, and bpslaunch calls it when a job
ends.

Example::

    segment = SharedSegment.open_or_create(segment_name("a1b2", 0, 7), 4096)
    view = segment.view            # writable memoryview of 4096 bytes
    segment.unlink(); segment.close()
"""

from __future__ import annotations

import errno
import glob
import logging
import mmap
import os
from typing import List, Optional

__all__ = ["SharedSegment", "segment_name", "sweep", "SHM_DIR"]

SHM_DIR = "/dev/shm"
log = logging.getLogger("byteps.common.shared_segment")


def segment_name(job_id: str, machine: int, tensor_id: int) -> str:
    return f"byteps-{job_id}-m{machine}-t{tensor_id}"


def job_prefix(job_id: str) -> str:
    return f"byteps-{job_id}-"


class SharedSegment:
    """One mapped segment: created by whichever local process comes first, opened by the others."""

    def __init__(self, name: str, nbytes: int, mapping: mmap.mmap) -> None:
        self.name = name
        self.nbytes = nbytes
        self._mapping: Optional[mmap.mmap] = mapping
        self.view = memoryview(mapping)
        self.unlinked = False

    @classmethod
    def open_or_create(cls, name: str, nbytes: int) -> SharedSegment:
        """Map ``name`` with ``nbytes``; every process asks for the same size (checked)."""
        if nbytes <= 0:
            raise ValueError(f"a shared segment needs a positive size, got {nbytes}")
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                os.ftruncate(fd, nbytes)  # several processes may do this: same size, idempotent
            elif size != nbytes:
                raise ValueError(
                    f"shared segment {path} has {size} bytes, this process needs {nbytes}: "
                    "every local worker must push_pull the same tensors with the same sizes")
            mapping = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(name, nbytes, mapping)

    def unlink(self) -> None:
        """Remove the name; the memory stays mapped here and in every process that mapped it."""
        if self.unlinked:
            return
        self.unlinked = True
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self._mapping is None:
            return
        self.view.release()
        try:
            self._mapping.close()
        except BufferError:
            # A numpy view of the segment is still alive somewhere; the
            # mapping goes when it does.
            log.debug("segment %s still referenced at close", self.name)
        self._mapping = None


def sweep(job_id: str, directory: str = SHM_DIR) -> List[str]:
    """Remove every segment name a job left behind; returns the names removed."""
    removed = []
    for path in glob.glob(os.path.join(glob.escape(directory), glob.escape(job_prefix(job_id)) + "*")):
        try:
            os.unlink(path)
            removed.append(os.path.basename(path))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("could not remove %s: %s", path, exc)
    return removed
