"""How a failure spreads: to the task's handle, this machine's other ranks and the other machines.

A push_pull that fails here fails where others wait on it: the machine's
other local ranks (an ERROR on the local channel) and, for a failure found
on this machine, the servers of the partitions this rank pushes, which
fail the round on every other machine (an ERROR per key). A server's
refusal of a key fails the tasks that use it (key 0: all). A broken job
(the communication thread's error, a lost node) fails every task in
flight with :class:`~byteps.common.handle.JobLost`.
"""

from __future__ import annotations

from typing import Any

from byteps.common.engine.route import Role
from byteps.common.engine.sparse_task import SparseTask
from byteps.common.engine.task import PushPullTask
from byteps.common.engine.task_table import TaskTable
from byteps.common.handle import JobLost

__all__ = ["Failures", "as_job_lost"]


class Failures:
    """Fails tasks, and tells whoever waits on them. ``exchange``, ``local``, ``sparse`` (the row-sparse
    exchange) and ``sparse_local`` (the machine's row-sparse sums) may be None."""

    def __init__(self, tasks: TaskTable, exchange: Any, local: Any, sparse: Any = None,
                 sparse_local: Any = None) -> None:
        self.tasks, self.exchange, self.local, self.sparse = tasks, exchange, local, sparse
        self.sparse_local = sparse_local

    def fail_task(self, task: PushPullTask, error: BaseException, tell_peers: bool = True,
                  tell_servers: bool = True) -> None:
        """Fail ``task`` here and where others wait on it: this machine's other ranks (``tell_peers``) and, for
        a failure found on this machine, the servers, which fail the round on the other machines."""
        if not self.tasks.remove(task):
            return  # finished or failed already
        if task.__class__ is SparseTask:
            self._tell_sparse(task, error, tell_peers, tell_servers)
        else:
            self._tell_dense(task, error, tell_peers, tell_servers)
        if not task.stand_in:  # a stand-in's handle has nobody waiting
            task.handle.set_error(error)
        if self.tasks.idle is not None:
            self.tasks.idle()

    def _tell_dense(self, task: PushPullTask, error: BaseException, tell_peers: bool, tell_servers: bool) -> None:
        if self.exchange is not None:
            self.exchange.abandon(task)
            if self.sparse is not None:
                self.sparse.abandon(task)
            if tell_servers and task.spans_machines():
                mine = [part for part in task.plan.partitions if self.local is None
                        or self.local.root_of(task.plan.tensor_id, part, self.local.members_of(task))
                        == self.local.local_rank]
                self.exchange.report_failure(task, mine, error)
        if self.local is not None:
            self.local.abandon(task)
            if tell_peers:
                self.local.tell_peers(task, error)

    def _tell_sparse(self, task: SparseTask, error: BaseException, tell_peers: bool, tell_servers: bool) -> None:
        """A row-sparse task: its servers hear of it from whoever pushes to them (a lone process, the table's
        local root), a local root's other ranks from the root, a root from its other rank."""
        if self.sparse is not None:
            self.sparse.abandon(task)
        if task.role is not Role.ALONE and self.sparse_local is not None:
            self.sparse_local.abandon(task)
            if tell_peers:
                self.sparse_local.tell(task, error)
        if tell_servers and self.exchange is not None and task.role is not Role.PEER and not task.lookup \
                and not task.table.asynchronous:  # an asynchronous table's other workers wait for no round
            self.exchange.report_failure(task, task.plan.partitions, error)

    def refuse_round(self, key: int, round_: int, server: int, error: BaseException) -> None:
        """This machine cannot take part in a round it has no task of: the key's server fails it elsewhere."""
        if self.exchange is not None:
            self.exchange.report_round(key, round_, server, error)

    def fail_key(self, key: int, error: BaseException) -> None:
        """A server refused ``key``: fail the tasks that use it (all, for key 0)."""
        failed = [task for task in self.tasks.active
                  if key == 0 or any(part.key == key for part in task.plan.partitions)]
        if not failed:
            raise error
        for task in failed:
            self.fail_task(task, error, True, tell_servers=False)

    def fail_all(self, lost: BaseException, tell_servers: bool = True) -> None:
        """Fail every task in flight with ``lost`` (see :func:`as_job_lost`). ``tell_servers=False`` for a lost
        node: every other worker learns of it from its own scheduler, as JobLost, where the servers' relay
        would reach it as a plain refusal and end an elastic worker that should roll back."""
        for task in list(self.tasks.active):
            self.fail_task(task, lost, tell_peers=False, tell_servers=tell_servers)


def as_job_lost(error: BaseException) -> JobLost:
    """Whatever ended the communication thread broke the job for every push_pull: a JobLost caused by it."""
    if isinstance(error, JobLost):
        return error
    lost = JobLost(str(error))
    lost.__cause__ = error
    return lost
