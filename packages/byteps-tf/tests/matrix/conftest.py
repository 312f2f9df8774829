"""tests/matrix/ imports tests/'s helpers (tf_jobs): pytest puts only this folder on sys.path."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
