"""The worker side of ``assert_all_ok``: named checks that print ``OK <name>``, then ``ALL OK <n>``.

A worker script that a test launches runs many checks per rank (a job
costs seconds to start, so one job checks many things). Each check prints
``OK <name>`` or ``FAIL <name>: <traceback>``; a failing check ends the
process at once (exit 1), because the other ranks may wait for push_pulls it
will never send, and bpslaunch tears the job down as soon as a worker fails.
The test reads the lines back with :func:`~byteps.testkit.rank_lines` and
:func:`~byteps.testkit.assert_all_ok`.

Framework-neutral: assertions on tensors stay in each adapter's scripts.

Example (in a worker script)::

    from byteps.testkit.checks import Checks

    checks = Checks()
    checks.run("push_pull_sums", lambda: ...)
    checks.done()                 # ALL OK 1
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Callable

__all__ = ["Checks", "check", "expect_error"]


def check(name: str, body: Callable[[], None]) -> None:
    """Run one named check: ``OK <name>``, or ``FAIL <name>: <traceback>`` and exit 1 at once."""
    try:
        body()
    except BaseException:
        print(f"FAIL {name}: " + traceback.format_exc().replace("\n", "\n    "), flush=True)
        sys.stderr.flush()
        os._exit(1)
    print(f"OK {name}", flush=True)


class Checks:
    """Runs checks in order and counts them; :meth:`done` prints ``ALL OK <count>``."""

    def __init__(self) -> None:
        self.count = 0

    def run(self, name: str, body: Callable[[], None]) -> None:
        check(name, body)
        self.count += 1

    def done(self) -> None:
        print(f"ALL OK {self.count}", flush=True)


def expect_error(kind: Any, text: str, call: Callable[[], object]) -> str:
    """``call()`` must raise ``kind`` (a class or tuple of them) with ``text`` in its message; returns the message."""
    try:
        call()
    except kind as exc:
        assert text in str(exc), f"{getattr(kind, '__name__', kind)} without {text!r}: {exc}"
        return str(exc)
    raise AssertionError(f"no {getattr(kind, '__name__', kind)} ({text!r}) was raised")
