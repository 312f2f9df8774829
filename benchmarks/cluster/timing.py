"""What every benchmark worker shares: its role from the environment, a clock, its result file.

Standard library only: it is imported by the byteps and gloo workers and by
the MXNet worker, which runs in a venv of its own.
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict

__all__ = ["now", "role_env", "write_result"]


def role_env() -> Dict[str, int]:
    """This worker's rank and the job's size, from the DMLC variables the rig sets."""
    return {"rank": int(os.environ["DMLC_WORKER_ID"]), "size": int(os.environ["DMLC_NUM_WORKER"])}


def write_result(path: str, record: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as out:
        json.dump(record, out)
    os.replace(tmp, path)


def now() -> float:
    return time.perf_counter()
