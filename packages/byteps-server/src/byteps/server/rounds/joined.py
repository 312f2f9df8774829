"""Join (Horovod's ``hvd.join()`` for uneven data): which machines joined, and whose zeros a round takes.

A worker machine that ran out of data sends JOIN after its last push (with
several worker processes per machine, one of them sends it, once every
local rank joined and the machine's pushes were answered). Joins are
counted per *machine* (``rank // local_size``): one process per machine
pushes each key (local aggregation), so a machine, not a process, is what
a round waits for. Until every machine joined, a round counts each joined
machine's missing push as zeros; once the last JOIN is in, every earlier
round is complete and the server forgets them all.

Whose zeros a round takes (the round policies push them, see
:mod:`byteps.server.rounds.sync_sum` and :mod:`~byteps.server.rounds.quorum`):

- a round that waits for every machine (:meth:`JoinedMachines.zeros_for`):
  each joined machine that has not pushed it;
- a round that closes at a quorum (backup workers,
  :meth:`JoinedMachines.zeros_for_quorum`): none while the machines that
  have not joined can still make the quorum; otherwise, once every one of
  them pushed, as many as the quorum lacks, so that the answer still holds
  ``quorum`` machines and averages still divide by it, as Horovod's join
  divides by the size with joined ranks as zeros.

A round that gathers or broadcasts (its pushes' aux is not 0) cannot take
zeros for a missing rank: it completes, but its pulls are answered with
the ERROR of :meth:`JoinedMachines.refusal`, as Horovod fails an allgather
or broadcast after a rank joined.
"""

from __future__ import annotations

from typing import Dict, List, Mapping

from byteps.common.tensor_description import PartitionSpec, describe_op

__all__ = ["JoinedMachines"]


class JoinedMachines:
    """The worker machines that joined while others still push, shared by every key of one server.

    ``machines`` maps a joined machine to the rank whose JOIN said so (for
    messages); it is cleared in place, so a policy may hold the dict itself.
    """

    def __init__(self, num_machines: int, local_size: int) -> None:
        self.num_machines = num_machines
        self.local_size = local_size
        self.machines: Dict[int, int] = {}

    def __bool__(self) -> bool:
        return bool(self.machines)

    def __contains__(self, machine: int) -> bool:
        return machine in self.machines

    def join(self, rank: int) -> bool:
        """Record the JOIN of worker ``rank``'s machine. True while other machines still push (their rounds in
        progress may now take zeros); False once every machine joined, when all are forgotten."""
        machine = rank // self.local_size
        if not 0 <= machine < self.num_machines:
            raise ValueError(f"JOIN from worker {rank}: not a worker of this job's {self.num_machines} machines")
        if machine in self.machines:
            where = "" if self.local_size == 1 else f" (machine {machine}, which joined as worker " \
                                                    f"{self.machines[machine]})"
            raise ValueError(f"worker {rank}{where} joined twice before every worker joined")
        self.machines[machine] = rank
        if len(self.machines) == self.num_machines:  # everyone is in: every earlier round is complete
            self.machines.clear()
            return False
        return True

    @property
    def live(self) -> int:
        """How many machines have not joined (and still push)."""
        return self.num_machines - len(self.machines)

    def zeros_for(self, pushed: Mapping[int, object]) -> List[int]:
        """The joined machines whose zeros a round over every machine takes: those not in ``pushed``."""
        return [machine for machine in self.machines if machine not in pushed]

    def zeros_for_quorum(self, pushed: Mapping[int, object], quorum: int) -> List[int]:
        """The joined machines whose zeros a round closed at ``quorum`` machines takes (see the module's doc):
        none while the live machines can make the quorum or some of them has not pushed; else enough to make
        it, each standing for a joined machine that did not push."""
        if self.live >= quorum:
            return []
        if any(machine not in pushed and machine not in self.machines for machine in range(self.num_machines)):
            return []
        return self.zeros_for(pushed)[:quorum - len(pushed)]

    def refusal(self, spec: PartitionSpec, tag: int, machine: int) -> str:
        """The ERROR a round that gathers or broadcasts (``tag``) answers with when ``machine`` joined."""
        return (f"{spec.describe()} {describe_op(False, tag)}, but worker {self.machines[machine]} has joined "
                "(hvd.join()): only allreduces count a joined rank as zeros; allgather, broadcast and the other "
                "collectives need every rank")
