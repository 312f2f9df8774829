"""``byteps-server`` (server or scheduler role), optionally recording per-partition timestamps.

The rig starts servers through this file only so that a traced run can
install :mod:`stage_probe` first; without ``BENCH_TRACE`` it is exactly
``python -m byteps.server``.
"""

import os
import sys

if os.environ.get("BENCH_TRACE"):
    import stage_probe

    stage_probe.install(os.environ["BENCH_TRACE"])

from byteps.server.cli import main  # noqa: E402

sys.exit(main())
