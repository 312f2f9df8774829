"""byteps-launcher: ``bpslaunch``, which starts a byteps job and never leaves orphans.

Two modes, chosen by the environment:

* embedded mode (``DMLC_ROLE`` unset): the whole job (scheduler, servers,
  workers) runs on this machine on 127.0.0.1, e.g. ``bpslaunch -np 2 python
  train.py``;
* role mode (``DMLC_ROLE`` set): BytePS's original contract, one
  ``bpslaunch`` per machine and role.

In both, the first process that fails tears the whole job down (SIGTERM to
every process group, a grace period, SIGKILL), and the kernel kills every
child if ``bpslaunch`` itself dies.

Example::

    from byteps.launcher import main
    raise SystemExit(main(["--workers", "2", "--", "python", "train.py"]))
"""

from byteps.common.interface import require_interface

INTERFACE_VERSION = (1, 0)

require_interface("byteps-common", "byteps.common", (3, 6), requirer="byteps-launcher")

from byteps.launcher.cli import main  # noqa: E402
from byteps.launcher.job_plan import JobPlan, ProcessSpec  # noqa: E402
from byteps.launcher.supervisor import JobOutcome, Supervisor  # noqa: E402

__all__ = [
    "INTERFACE_VERSION",
    "JobOutcome",
    "JobPlan",
    "ProcessSpec",
    "Supervisor",
    "main",
]
