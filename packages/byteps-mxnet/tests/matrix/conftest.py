"""The matrix tests reuse the default tests' job launcher and checks, which sit one folder up."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
