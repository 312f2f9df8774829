r"""Relaying children's output, one prefixed line at a time.

Every child writes to its own pipes; bpslaunch reads them (from the
supervisor's single select loop, so no threads exist when it forks the next
child) and re-prints each complete line with the child's prefix, e.g.
``[worker 1] loss=0.3``, flushing at once. A partial line is kept until its
newline arrives, so lines from different children never interleave
mid-line; whatever is left when a pipe closes is printed with a newline
added. Bytes are passed through untouched: a child's output need not be
UTF-8.

Carriage returns are progress bars redrawing themselves (tqdm writes
``\r`` and then the whole bar, again and again, on one line):

* Into a file or a pipe, only completed lines are written: of a line that
  was redrawn, what a terminal would show last (tqdm's final bar when it is
  kept, nothing when it was cleared), never the redraws nor a stray ``\r``.
* On a terminal, bpslaunch keeps one live status line under the completed
  lines and redraws it in place: the progress of the first child (in launch
  order: the lowest-ranked worker that draws one, as torchrun users see
  rank 0's bar), cut to the terminal's width so that it never wraps. The
  other children's redraws are not drawn; their completed lines are.

Example::

    console = Console()
    line = PrefixedLines(b"[worker 0] ", console.stdout)
    line.feed(b"hello\nwor")   # prints "[worker 0] hello"
    line.feed(b"ld\n")         # prints "[worker 0] world"
    line.feed(b"\r 10%\r 20%")  # a terminal shows "[worker 0]  20%" in place; a file gets nothing yet
"""

from __future__ import annotations

import itertools
import os
import selectors
import sys
from typing import BinaryIO, Callable, Dict, Optional

__all__ = ["Console", "PrefixedLines", "OutputRelay"]

#: A line longer than this is printed in pieces rather than held forever.
MAX_PENDING_BYTES = 1 << 16
READ_SIZE = 1 << 16
#: Back to the line's start and erase it (ANSI: carriage return, erase to end of line).
_ERASE_LINE = b"\r\x1b[K"


class StatusLine:
    """The live progress line at the bottom of a terminal, shared by bpslaunch's stdout and stderr.

    ``frames`` holds each drawing child's latest progress, keyed by the
    child's launch order; the lowest key is the one shown.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._frames: Dict[int, bytes] = {}
        self._drawn = b""

    def set(self, owner: int, frame: Optional[bytes]) -> None:
        """``owner``'s progress is now ``frame`` (None: it has none)."""
        if frame is None:
            self._frames.pop(owner, None)
        else:
            self._frames[owner] = frame
        self.draw()

    def _wanted(self) -> bytes:
        if not self._frames:
            return b""
        frame = self._frames[min(self._frames)]
        try:
            width = os.get_terminal_size(self._stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            width = 80
        # Cut by characters (a bar is drawn in UTF-8 blocks), one column short of the
        # width: a line that fills it exactly wraps on some terminals.
        text = frame.decode("utf-8", "replace")
        return text[: max(width - 1, 1)].encode("utf-8")

    def clear(self) -> None:
        """Erase the drawn line (before a completed line is written above it)."""
        if self._drawn:
            self._write(_ERASE_LINE)
            self._drawn = b""

    def draw(self) -> None:
        wanted = self._wanted()
        if wanted != self._drawn:
            self._write(_ERASE_LINE + wanted)
            self._drawn = wanted

    def _write(self, data: bytes) -> None:
        try:
            self._stream.write(data)
            self._stream.flush()
        except (BrokenPipeError, ValueError, OSError):
            self._frames.clear()


def _is_terminal(stream: BinaryIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _Sink:
    """A binary stream that stops (quietly) once its reader has gone away.

    Completed lines are written with ``sink(data)``; ``sink.progress(owner,
    frame)`` reports a child's redrawn progress, which only a terminal shows.
    """

    def __init__(self, stream: BinaryIO, status: Optional[StatusLine]) -> None:
        self._stream: Optional[BinaryIO] = stream
        self._status = status

    def __call__(self, data: bytes) -> None:
        if self._stream is None:
            return
        if self._status is not None:
            self._status.clear()
        try:
            self._stream.write(data)
            self._stream.flush()
        except (BrokenPipeError, ValueError):  # reader closed: `bpslaunch ... | head`
            self._stream = None
        if self._status is not None:
            self._status.draw()

    def progress(self, owner: int, frame: Optional[bytes]) -> None:
        if self._status is not None and self._stream is not None:
            self._status.set(owner, frame)


class Console:
    """bpslaunch's stdout and stderr as byte sinks, plus its own notes.

    When stdout is a terminal it carries the live status line; stderr, when
    it is a terminal too, erases and redraws that line around what it writes.
    """

    def __init__(self, stdout: Optional[BinaryIO] = None, stderr: Optional[BinaryIO] = None) -> None:
        out = stdout if stdout is not None else sys.stdout.buffer
        err = stderr if stderr is not None else sys.stderr.buffer
        status = StatusLine(out) if _is_terminal(out) else None
        self.stdout = _Sink(out, status)
        self.stderr = _Sink(err, status if _is_terminal(err) else None)

    def note(self, message: str) -> None:
        """A message of bpslaunch itself, on stderr: ``bpslaunch: <message>``."""
        self.stderr(f"bpslaunch: {message}\n".encode("utf-8", "replace"))


#: Launch order of the relayed streams: the first one drawing progress owns the status line.
_owners = itertools.count()


def _shown(line: bytes) -> bytes:
    r"""What a terminal shows last of a line redrawn with carriage returns (``\r\n`` counts as ``\n``)."""
    return line.rstrip(b"\r").rsplit(b"\r", 1)[-1]


class PrefixedLines:
    """Splits a byte stream into lines and writes each completed one with a prefix.

    ``sink`` is called with completed lines; if it has a ``progress(owner,
    frame)`` method, it also learns each redraw of a line (a terminal's
    status line), else redraws are dropped.
    """

    def __init__(self, prefix: bytes, sink: Callable[[bytes], None]) -> None:
        self._prefix = prefix
        self._sink = sink
        self._progress = getattr(sink, "progress", None)
        self._owner = next(_owners)
        self._pending = b""
        self._drawing = False

    def feed(self, data: bytes) -> None:
        data = self._pending + data
        *lines, self._pending = data.split(b"\n")
        complete = []
        for line in lines:
            shown = _shown(line)
            # A bar cleared at its end (tqdm's leave=False) leaves only blanks behind: nothing to keep.
            if shown.strip() or b"\r" not in line:
                complete.append(self._prefix + shown + b"\n")
        if b"\r" in self._pending:
            # Keep only the latest redraw: the line so far is what follows the last \r.
            cut = self._pending.rfind(b"\r")
            frame = self._pending[cut + 1:] or _shown(self._pending[:cut])
            self._pending = self._pending[cut:]
            self._draw(frame if frame.strip() else None)
        elif lines:
            self._draw(None)
        if len(self._pending) > MAX_PENDING_BYTES:
            complete.append(self._prefix + _shown(self._pending) + b"\n")
            self._pending = b""
        if complete:
            self._sink(b"".join(complete))

    def _draw(self, frame: Optional[bytes]) -> None:
        if self._progress is None or (frame is None and not self._drawing):
            return
        self._drawing = frame is not None
        self._progress(self._owner, None if frame is None else self._prefix + frame)

    def finish(self) -> None:
        """Print a trailing partial line, newline added."""
        pending, self._pending = self._pending, b""
        self._draw(None)
        if pending and (_shown(pending).strip() or b"\r" not in pending):
            self._sink(self._prefix + _shown(pending) + b"\n")


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
