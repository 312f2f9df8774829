"""Output relaying: every line prefixed with role and rank, partial lines kept, flushed at once."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios

import pytest
from launcher_harness import PY, ROLE_WORKER_ENV

from byteps.launcher.output import MAX_PENDING_BYTES, PrefixedLines
from byteps.testkit import LAUNCHER


def collect():
    written = []
    return written, PrefixedLines(b"[w] ", written.append)


def test_lines_split_across_chunks():
    written, lines = collect()
    lines.feed(b"hel")
    assert written == []
    lines.feed(b"lo\nwor")
    lines.feed(b"ld\n\nlast")
    lines.finish()
    assert b"".join(written) == b"[w] hello\n[w] world\n[w] \n[w] last\n"


def test_finish_without_partial_line_adds_nothing():
    written, lines = collect()
    lines.feed(b"a\n")
    lines.finish()
    assert written == [b"[w] a\n"]


def test_overlong_partial_line_is_not_held_forever():
    written, lines = collect()
    lines.feed(b"x" * (MAX_PENDING_BYTES + 1))
    assert written and written[0].startswith(b"[w] xxx")


def test_stdout_and_stderr_are_prefixed_with_the_global_rank(job):
    code = (
        "import os, sys\n"
        "rank = os.environ['BYTEPS_LOCAL_RANK']\n"
        "print('out', rank)\n"
        "print('err', rank, file=sys.stderr)\n"
        "sys.stdout.write('no newline')\n"
    )
    env = job.env(**ROLE_WORKER_ENV, DMLC_NUM_WORKER="2", DMLC_WORKER_ID="1", BYTEPS_LOCAL_SIZE="2")
    rc, out, err = job.run([PY, "-c", code], env=env)
    assert rc == 0
    assert sorted(out.splitlines()) == sorted([
        "[worker 2] out 0", "[worker 2] no newline", "[worker 3] out 1", "[worker 3] no newline",
    ])
    assert sorted(line for line in err.splitlines() if line.startswith("[")) == [
        "[worker 2] err 0", "[worker 3] err 1",
    ]


def test_bytes_pass_through_untouched(job):
    code = "import sys; sys.stdout.buffer.write(b'\\xff\\xfe bin\\n')"
    proc = subprocess.run([*LAUNCHER, PY, "-c", code], capture_output=True, env=job.env(), timeout=20)
    assert proc.returncode == 0
    assert proc.stdout == b"[worker 0] \xff\xfe bin\n"


def test_lines_arrive_promptly(job, tmp_path):
    # No flush=True: PYTHONUNBUFFERED=1 from bpslaunch makes the child write at once. The child
    # prints its second line only after the test has read the first: relayed at once, not at exit.
    go = tmp_path / "go"
    code = ("import os, sys, time; print('first')\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
            "print('second')")
    proc = job.start([PY, "-c", code])
    assert proc.stdout.readline() == b"[worker 0] first\n"
    go.touch()
    assert proc.stdout.readline() == b"[worker 0] second\n"
    proc.wait(timeout=20)
    assert proc.returncode == 0


class Recorder:
    """A sink that keeps completed lines and, like a terminal's, each redraw it is told of."""

    def __init__(self):
        self.lines, self.frames = [], []

    def __call__(self, data: bytes) -> None:
        self.lines.append(data)

    def progress(self, owner: int, frame) -> None:
        self.frames.append(frame)


#: What tqdm writes for a bar it clears at its end (leave=False), then the line printed after it.
TQDM_STREAM = (b"\repoch 1:   0%|          | 0/3", b"\repoch 1:  33%|###3      | 1/3",
               b"\repoch 1: 100%|##########| 3/3\r", b"                              \r",
               b"epoch 1: loss 0.5\n")


def test_a_redrawn_line_reaches_a_file_only_as_its_last_state():
    written, lines = collect()
    for chunk in TQDM_STREAM:
        lines.feed(chunk)
    lines.feed(b"\rkept bar 50%\rkept bar 100%\n")  # tqdm's leave=True: the final bar stays
    lines.finish()
    assert b"".join(written) == b"[w] epoch 1: loss 0.5\n[w] kept bar 100%\n"


def test_windows_line_ends_and_plain_blank_lines_are_kept():
    written, lines = collect()
    lines.feed(b"a\r\n\nb\r\n")
    assert b"".join(written) == b"[w] a\n[w] \n[w] b\n"


def test_a_terminal_sink_is_told_every_redraw_and_the_end_of_the_bar():
    sink = Recorder()
    lines = PrefixedLines(b"[w] ", sink)
    for chunk in TQDM_STREAM:
        lines.feed(chunk)
    assert sink.lines == [b"[w] epoch 1: loss 0.5\n"]
    assert sink.frames == [b"[w] epoch 1:   0%|          | 0/3", b"[w] epoch 1:  33%|###3      | 1/3",
                           b"[w] epoch 1: 100%|##########| 3/3", None]


def test_a_partial_line_left_at_exit_is_its_last_redraw():
    written, lines = collect()
    lines.feed(b"\r 10%\r 90%")
    lines.finish()
    assert written == [b"[w]  90%\n"]


def rendered(raw: bytes) -> list:
    """The screen a terminal shows after ``raw``: carriage return, erase to end of line, newline."""
    screen, line, column = [], [], 0
    for token in raw.replace(b"\x1b[K", b"\x00").decode("utf-8", "replace"):
        if token == "\r":
            column = 0
        elif token == "\x00":
            del line[column:]
        elif token == "\n":
            screen.append("".join(line))
            line, column = [], 0
        else:
            line[column:column + 1] = [token]
            column += 1
    return screen + (["".join(line)] if line else [])


#: Two ranks, each drawing a tqdm bar per epoch that it clears, then printing one line per epoch.
TQDM_JOB = (
    "import os, sys, time\n"
    "from tqdm import tqdm\n"
    "rank = os.environ['BYTEPS_LOCAL_RANK']\n"
    "for epoch in range(3):\n"
    "    for _ in tqdm(range(30), desc=f'rank {rank} epoch {epoch}', leave=False, file=sys.stdout,\n"
    "                  mininterval=0, ncols=70):\n"
    "        time.sleep(0.01)\n"
    "    print(f'rank {rank} epoch {epoch} done', flush=True)\n"
)
EPOCH_LINES = sorted(f"[worker {rank}] rank {rank} epoch {epoch} done" for rank in range(2) for epoch in range(3))


def test_progress_bars_into_a_file_leave_one_line_per_epoch_per_rank(job, tmp_path):
    pytest.importorskip("tqdm")
    log = tmp_path / "job.log"
    with log.open("wb") as out:
        proc = subprocess.run([*LAUNCHER, "-np", "2", "--", PY, "-c", TQDM_JOB], stdout=out,
                              stderr=subprocess.PIPE, env=job.env(), timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    text = log.read_bytes()
    assert b"\r" not in text and b"\x1b" not in text
    assert sorted(text.decode().splitlines()) == EPOCH_LINES


def test_progress_bars_on_a_terminal_are_redrawn_in_place_within_its_width(job):
    pytest.importorskip("tqdm")
    columns = 50
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen([*LAUNCHER, "-np", "2", "--", PY, "-c", TQDM_JOB], stdout=follower,
                            stderr=subprocess.PIPE, env=job.env(), start_new_session=True)
    job.launched.append(proc)
    os.close(follower)
    raw = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # EIO: every writer of the terminal has gone
            break
        if not chunk:
            break
        raw += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
    # The bars were drawn, in place (erase the line, draw the frame), cut to the width.
    redraws = [piece for piece in raw.split(b"\r\x1b[K") if piece.startswith(b"[worker 0] rank 0 epoch")]
    assert len(redraws) >= 10
    assert all(len(piece.decode("utf-8", "replace").split("\r")[0]) < columns for piece in redraws)
    # and what stays on the screen is exactly the completed lines, the status line erased at the end.
    assert sorted(line for line in rendered(raw) if line) == EPOCH_LINES
