"""The worker's engine: every partition of every push_pull along its route, on one thread.

A push_pull becomes a :class:`~byteps.common.engine.task.PushPullTask`
(:mod:`~byteps.common.engine.task_maker`); each of its partitions a trip on
one of the routes listed in :mod:`~byteps.common.engine.route`. The
:class:`~byteps.common.engine.dispatcher.Dispatcher` runs each stage through
the stage's owner, in the manner of gloo's ``transport/tcp/`` files, one
module each:

* :mod:`~byteps.common.engine.exchange`: EXCHANGE, with the servers;
* :mod:`~byteps.common.engine.local` (and :mod:`~byteps.common.engine.local_join`):
  COPY_IN, LOCAL_REDUCE, LOCAL_BROADCAST, with the machine's other processes;
* :mod:`~byteps.common.engine.device`: a CUDA tensor's stages;
* :mod:`~byteps.common.engine.compress`: COMPRESS, DECOMPRESS;
* :mod:`~byteps.common.engine.copy_out`: COPY_OUT;
* :mod:`~byteps.common.engine.sparse_exchange`: SPARSE_EXCHANGE, SPARSE_MERGE, the stages of a
  row-sparse push_pull (:mod:`~byteps.common.engine.sparse_task`, docs/sparse.md);
* :mod:`~byteps.common.engine.sparse_local`: SPARSE_TO_ROOT, SPARSE_LOCAL_SUM, SPARSE_LOCAL_ANSWER,
  a machine's row-sparse rows summed by id before they leave it.

How a stage finishes is one contract (:mod:`~byteps.common.engine.stage`);
:mod:`~byteps.common.engine.failures` spreads a failure,
:mod:`~byteps.common.engine.join` runs ``hvd.join()``,
:mod:`~byteps.common.engine.engine` puts the parts together and
:mod:`~byteps.common.engine.loop` is the thread: a poller and a queue.
"""

from byteps.common.engine.engine import Engine, EngineOptions
from byteps.common.engine.loop import CommLoop
from byteps.common.engine.route import ROUTES, Landing, Placement, Role, Route, Stage, plan_route, route_table
from byteps.common.engine.task import PartitionTrip, PushPullTask
from byteps.common.engine.task_maker import TaskMaker

__all__ = ["CommLoop", "Engine", "EngineOptions", "PartitionTrip", "PushPullTask", "TaskMaker", "ROUTES", "Landing",
           "Placement", "Role", "Route", "Stage", "plan_route", "route_table"]
