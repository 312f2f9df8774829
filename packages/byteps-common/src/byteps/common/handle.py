"""Handles of asynchronous push_pulls: poll them, wait on them."""

from __future__ import annotations

import threading
from typing import Any, Optional

__all__ = ["Handle", "PushPullError"]


class PushPullError(RuntimeError):
    """A push_pull failed: a server refused it or the job broke."""


class Handle:
    """The future of one push_pull. ``wait()`` returns the output tensor."""

    def __init__(self, name: str, output: Any) -> None:
        self.name = name
        self._output = output
        self._done = threading.Event()
        self._error: Optional[BaseException] = None

    def poll(self) -> bool:
        """True once the push_pull has finished (successfully or not)."""
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until done; return the output or raise its error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"push_pull of {self.name!r} did not finish within {timeout} s")
        if self._error is not None:
            raise PushPullError(f"push_pull of {self.name!r} failed: {self._error}") from self._error
        return self._output

    def set_done(self) -> None:
        self._done.set()

    def set_error(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()
