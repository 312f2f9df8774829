"""A worker of a role-mode job, run as BytePS's own tests run theirs: not under bpslaunch, the process stays.

It push_pulls ``arange(8) * (rank + 1)`` twice, prints ``RESULT <values>``,
shuts down through the frameworks' ``shutdown()`` and prints ``LEFT``; then,
like BytePS's tests (which join the scheduler before they exit), it waits
for a line on stdin before exiting. With ``die`` as argument it SIGKILLs
itself after the push_pulls instead.
"""

import os
import signal
import sys

import numpy as np

import byteps.common as bps
from byteps.common.frontend import process

process.init()
values = np.arange(8, dtype=np.float32) * (bps.rank() + 1)
for _ in range(2):
    result = bps.push_pull(values.copy(), name="role.mode")
print("RESULT", " ".join(f"{v:g}" for v in result), flush=True)
if sys.argv[1:] == ["die"]:
    os.kill(os.getpid(), signal.SIGKILL)
process.shutdown()
print("LEFT", flush=True)
sys.stdin.readline()
