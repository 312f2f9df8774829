"""``python -m byteps.launcher`` is ``bpslaunch``."""

import sys

from byteps.launcher.cli import main

sys.exit(main())
