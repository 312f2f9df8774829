"""byteps-server: the parameter server of a byteps job.

A CPU-only process (no deep-learning framework needed) that sums the
partitions every worker pushes, in C++ on BYTEPS_SERVER_ENGINE_THREAD
threads, and answers each worker's pull with the sum. The same entry point
runs the job's scheduler::

    DMLC_ROLE=server DMLC_PS_ROOT_URI=10.0.0.1 DMLC_PS_ROOT_PORT=9000 \\
    DMLC_NUM_WORKER=2 DMLC_NUM_SERVER=1 byteps-server
"""

from byteps.common.interface import require_interface

# 1.3: a row-sparse round is one push per machine; 1.2: row-sparse rounds in parts; 1.1: row-sparse keys
# (rounds.SparseRowSum)
INTERFACE_VERSION = (1, 5)

require_interface("byteps-common", "byteps.common", (3, 6), requirer="byteps-server")
require_interface("byteps-transport", "byteps.transport", (2, 12), requirer="byteps-server")

__all__ = ["INTERFACE_VERSION"]
