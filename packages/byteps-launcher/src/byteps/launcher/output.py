"""Relaying children's output, one prefixed line at a time.

Every child writes to its own pipes; bpslaunch reads them (from the
supervisor's single select loop, so no threads exist when it forks the next
child) and re-prints each complete line with the child's prefix, e.g.
``[worker 1] loss=0.3``, flushing at once. A carriage return ends a line
too, so a progress bar that redraws itself (tqdm) is relayed as it moves.
A partial line is kept until its newline or carriage return arrives, so lines from different children never interleave
mid-line; whatever is left when a pipe closes is printed with a newline
added. Bytes are passed through untouched: a child's output need not be
UTF-8.

Example::

    console = Console()
    line = PrefixedLines(b"[worker 0] ", console.stdout)
    line.feed(b"hello\\nwor")   # prints "[worker 0] hello"
    line.feed(b"ld\\n")         # prints "[worker 0] world"
"""

from __future__ import annotations

import os
import selectors
import sys
from typing import BinaryIO, Callable, Dict, Optional

__all__ = ["Console", "PrefixedLines", "OutputRelay"]

#: A line longer than this is printed in pieces rather than held forever.
MAX_PENDING_BYTES = 1 << 16
READ_SIZE = 1 << 16


class _Sink:
    """A binary stream that stops (quietly) once its reader has gone away."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream: Optional[BinaryIO] = stream

    def __call__(self, data: bytes) -> None:
        if self._stream is None:
            return
        try:
            self._stream.write(data)
            self._stream.flush()
        except (BrokenPipeError, ValueError):  # reader closed: `bpslaunch ... | head`
            self._stream = None


class Console:
    """bpslaunch's stdout and stderr as byte sinks, plus its own notes."""

    def __init__(self, stdout: Optional[BinaryIO] = None, stderr: Optional[BinaryIO] = None) -> None:
        self.stdout = _Sink(stdout if stdout is not None else sys.stdout.buffer)
        self.stderr = _Sink(stderr if stderr is not None else sys.stderr.buffer)

    def note(self, message: str) -> None:
        """A message of bpslaunch itself, on stderr: ``bpslaunch: <message>``."""
        self.stderr(f"bpslaunch: {message}\n".encode("utf-8", "replace"))


class PrefixedLines:
    """Splits a byte stream into lines and writes each with a prefix."""

    def __init__(self, prefix: bytes, sink: Callable[[bytes], None]) -> None:
        self._prefix = prefix
        self._sink = sink
        self._pending = b""

    def feed(self, data: bytes) -> None:
        data = self._pending + data
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        complete, self._pending = data[:end], data[end:]
        if len(self._pending) > MAX_PENDING_BYTES:
            complete, self._pending = complete + self._pending + b"\n", b""
        if complete:
            lines = complete.splitlines(keepends=True)
            self._sink(b"".join(self._prefix + line for line in lines))

    def finish(self) -> None:
        """Print a trailing partial line, newline added."""
        if self._pending:
            pending, self._pending = self._pending, b""
            self._sink(self._prefix + pending + b"\n")


class OutputRelay:
    """Reads registered pipes through a selector and relays them as prefixed lines."""

    def __init__(self, selector: selectors.BaseSelector) -> None:
        self._selector = selector
        self._streams: Dict[int, PrefixedLines] = {}

    def attach(self, fd: int, prefix: str, sink: Callable[[bytes], None]) -> None:
        """Relay everything read from ``fd`` to ``sink``; the relay owns and closes ``fd``."""
        os.set_blocking(fd, False)
        self._streams[fd] = PrefixedLines(prefix.encode("utf-8", "replace"), sink)
        self._selector.register(fd, selectors.EVENT_READ, lambda: self._read(fd))

    @property
    def open_count(self) -> int:
        return len(self._streams)

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._streams[fd].feed(data)
        else:
            self._detach(fd)

    def _detach(self, fd: int) -> None:
        stream = self._streams.pop(fd)
        self._selector.unregister(fd)
        os.close(fd)
        stream.finish()

    def close(self) -> None:
        """Read what is already buffered in every pipe, then close them all."""
        for fd in list(self._streams):
            while fd in self._streams:
                try:
                    data = os.read(fd, READ_SIZE)
                except (BlockingIOError, OSError):
                    data = b""
                if data:
                    self._streams[fd].feed(data)
                else:
                    self._detach(fd)
