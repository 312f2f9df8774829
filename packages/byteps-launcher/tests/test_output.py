"""Output relaying: every line prefixed with role and rank, partial lines kept, flushed at once."""

from __future__ import annotations

import subprocess
import time

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


def test_lines_arrive_promptly(job):
    # No flush=True: PYTHONUNBUFFERED=1 from bpslaunch makes the child write at once.
    code = "import time; print('first'); time.sleep(3); print('second')"
    proc = job.start([PY, "-c", code])
    started = time.monotonic()
    assert proc.stdout.readline() == b"[worker 0] first\n"
    assert time.monotonic() - started < 2
    assert proc.stdout.readline() == b"[worker 0] second\n"
    proc.wait(timeout=10)
    assert proc.returncode == 0
