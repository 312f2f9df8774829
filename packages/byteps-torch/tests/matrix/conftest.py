"""The matrix tests reuse the default tests' helpers (job_checks.py, the checks of test_*.py): pytest puts only
this folder on sys.path, so its parent goes there too."""

import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
