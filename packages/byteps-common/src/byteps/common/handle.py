"""Handles of asynchronous push_pulls: poll them, wait on them."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, List, Optional

__all__ = ["Handle", "PushPullError", "JobLost", "failure", "all_done"]

log = logging.getLogger("byteps.common.handle")


class PushPullError(RuntimeError):
    """A push_pull failed: a server refused it or the job broke."""


class JobLost(PushPullError):
    """The job broke under a push_pull: a process of it died, or its scheduler stopped.

    Every push_pull in flight fails with it, and so does every later one
    until the worker leaves the job. Under ``bpslaunch --min-np`` this is
    what elastic training recovers from (Horovod's ``HorovodInternalError``
    from a lost peer); a refusal (ranks that disagree) stays a plain
    PushPullError, since starting again would only repeat it.
    """


def failure(name: str, error: BaseException) -> PushPullError:
    """What waiting on a failed push_pull of ``name`` raises: JobLost if ``error`` is one, else PushPullError."""
    kind = JobLost if isinstance(error, JobLost) else PushPullError
    return kind(f"push_pull of {name!r} failed: {error}")


class Handle:
    """The future of one push_pull. ``wait()`` returns the output tensor."""

    def __init__(self, name: str, output: Any) -> None:
        self.name = name
        self._output = output
        self._done = threading.Event()
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._callbacks: List[Callable[[Handle], None]] = []
        #: Backup workers: rounds of its tensor that had closed after this one when it was answered (the
        #: least over its partitions); None for a push_pull whose rounds wait for every worker.
        self.rounds_closed_after: Optional[int] = None

    def poll(self) -> bool:
        """True once the push_pull has finished (successfully or not)."""
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until done; return the output or raise its error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"push_pull of {self.name!r} did not finish within {timeout} s")
        if self._error is not None:
            raise failure(self.name, self._error) from self._error
        return self._output

    @property
    def error(self) -> Optional[BaseException]:
        """The failure, once done; None on success or while running."""
        return self._error

    def add_done_callback(self, callback: Callable[[Handle], None]) -> None:
        """Call ``callback(handle)`` once done, from the thread that finishes it (now, if done).

        Callbacks run on byteps' communication thread: keep them short and
        never wait on another push_pull inside one.
        """
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        self._run(callback)

    def _run(self, callback: Callable[[Handle], None]) -> None:
        try:
            callback(self)
        except Exception:  # a user callback must not kill the communication thread
            log.exception("a done-callback of push_pull %r raised", self.name)

    def _finish(self, error: Optional[BaseException]) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._error = error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            self._run(callback)

    def set_done(self) -> None:
        self._finish(None)

    def set_error(self, error: BaseException) -> None:
        self._finish(error)


class _AllDone(Handle):
    """Done when every handle of a group is; fails with the first failure among them."""

    def __init__(self, name: str, handles: List[Handle]) -> None:
        super().__init__(name, None)
        self._left = len(handles)
        self._first_error: Optional[BaseException] = None
        self._count_lock = threading.Lock()
        if not handles:
            self.set_done()
        for handle in handles:
            handle.add_done_callback(self._one_done)

    def _one_done(self, handle: Handle) -> None:
        with self._count_lock:
            if handle.error is not None and self._first_error is None:
                self._first_error = handle.error
            self._left -= 1
            last = self._left == 0
        if last:
            self._finish(self._first_error)


def all_done(handles: List[Handle], name: Optional[str] = None) -> Handle:
    """One handle for several: done when all of ``handles`` are, failed with the first error among them.
    ``name`` defaults to the handles' names joined by ``+``."""
    handles = list(handles)
    return _AllDone(name if name is not None else "+".join(h.name for h in handles) or "(none)", handles)
