"""The remote end of a child started over ssh (``python -m byteps.launcher.remote``).

Reads one JSON line from standard input, ``{"argv": [...], "env": {...}}``
(see :mod:`byteps.launcher.ssh`), starts ``argv`` with this host's own
environment updated by ``env``, in a session of its own, and relays
nothing itself: the child writes to this process's stdout and stderr,
which ssh carries back. Then it watches its standard input: when it
closes (the launcher's ssh client is gone: bpslaunch ended the job, or
died), the child's whole process group gets SIGTERM and, 5 s later,
SIGKILL. SIGTERM/SIGHUP/SIGINT here do the same. Exits with the child's
status (128 + N when a signal N killed it), which ssh hands back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

__all__ = ["main"]

KILL_AFTER_S = 5.0


def _stop(child: subprocess.Popen) -> None:
    """SIGTERM to the child's group, SIGKILL after KILL_AFTER_S if anything of it is left."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + KILL_AFTER_S
    while time.monotonic() < deadline:
        try:
            os.killpg(child.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> int:
    line = sys.stdin.buffer.readline()
    try:
        request = json.loads(line)
        argv, env = list(request["argv"]), {str(k): str(v) for k, v in request["env"].items()}
    except (ValueError, KeyError, TypeError) as exc:
        print(f"byteps.launcher.remote: bad request on standard input ({exc}); this module is started by "
              "bpslaunch over ssh, not by hand", file=sys.stderr)
        return 2
    try:
        child = subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
    except OSError as exc:
        print(f"byteps.launcher.remote: cannot start {argv[0]!r} on {os.uname().nodename}: {exc}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    stopping: Optional[threading.Thread] = None

    def stop_once() -> None:
        nonlocal stopping
        if stopping is None:
            stopping = threading.Thread(target=_stop, args=(child,), daemon=True)
            stopping.start()

    def watch_input() -> None:
        while sys.stdin.buffer.read(4096):  # nothing more is sent: this returns b"" when ssh goes away
            pass
        stop_once()

    threading.Thread(target=watch_input, daemon=True).start()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda *_: stop_once())
    returncode = child.wait()
    if stopping is not None:
        stopping.join()
    else:  # the child ended by itself: whatever it started goes with it
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return 128 - returncode if returncode < 0 else returncode


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: the thread that watches standard input is blocked in a read, which interpreter
    # shutdown would wait on; nothing else is left to clean up.
    os._exit(code)
