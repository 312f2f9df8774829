"""What a round of a key is on the parameter server: one policy object per key, chosen at INIT_KEY.

The server's event loop (:mod:`byteps.server.parameter_server`) receives,
checks and dispatches messages; what a PUSH or a PULL *does* is up to the
key's round policy, which :func:`declare_key` picks from the key's
:class:`~byteps.common.tensor_description.PartitionSpec`:

===========================  ====================================================================
``sync_sum.SyncSum``         the synchronous round: one push per machine summed by the engine,
                             every pull answered with the sum (BytePS's synchronous mode)
``quorum.QuorumSum``         backup workers (``spec.quorum``): rounds close at a quorum of
                             machines, late pushes dropped, closed rounds kept for late pulls
``async_store.AsyncStore``   asynchronous keys (``spec.asynchronous``): round 0 fills a store,
                             later pushes are deltas added to it, pulls get a copy of it
``sparse_rows.SparseRowSum`` a row-sparse table's rows on this server (``spec.sparse``): each
                             round's (id, row) pushes summed by id, the union answered to all
``held_rows.HeldRows``       a server-held table's rows (``spec.held``): kept here, looked up by
                             id at once, each round's summed rows stepped by its optimizer
``async_held_rows``          the same in an asynchronous job (``spec.held`` and ``asynchronous``):
``.AsyncHeldRows``           each process's push stepped on arrival, answered alone
===========================  ====================================================================

Two strategies combine with the sums rather than multiplying the classes:
``compressed.CompressedSums``, the codec a compressed key's pushes and
answers go through (``spec.compression``, with or without a quorum), and
``joined.JoinedMachines``, the machines that joined (hvd.join) and whose
zeros a round takes, shared by every key of a server. ``key_state`` holds
what they all share: the :class:`KeyState` of a key, the
:class:`RoundPolicy` interface and the server's :class:`RoundServices`.

Example (what the server does for an INIT_KEY, then for each message)::

    services = RoundServices(engine, listener.send, rank, num_machines, local_size,
                             JoinedMachines(num_machines, local_size))
    state = declare_key(key, spec, services)
    state.policy.push(message)          # a PUSH of this key
    state.policy.pull(message)          # a PULL of this key
"""

from __future__ import annotations

from byteps.common.tensor_description import PartitionSpec
from byteps.server.rounds.async_held_rows import AsyncHeldRows
from byteps.server.rounds.async_store import AsyncStore
from byteps.server.rounds.compressed import CompressedSums
from byteps.server.rounds.held_rows import HeldRows
from byteps.server.rounds.joined import JoinedMachines
from byteps.server.rounds.key_state import KeyState, RoundPolicy, RoundServices, wire_log
from byteps.server.rounds.quorum import BACKUP_MAX_LAG, QuorumSum
from byteps.server.rounds.sparse_rows import SparseRowSum
from byteps.server.rounds.sync_sum import SyncSum

__all__ = ["AsyncHeldRows", "AsyncStore", "BACKUP_MAX_LAG", "CompressedSums", "HeldRows", "JoinedMachines", "KeyState",
           "QuorumSum", "RoundPolicy", "RoundServices", "SparseRowSum", "SyncSum", "declare_key", "wire_log"]


def declare_key(key: int, spec: PartitionSpec, services: RoundServices) -> KeyState:
    """A new key: its state with the round policy ``spec`` asks for, and the key declared to the engine.

    Raises ValueError for a description no policy can serve (a quorum not
    below the key's machines, a compression the codec refuses); the engine
    is touched only once the policy exists.
    """
    contributors = spec.contributors or services.num_machines
    if spec.quorum and not 0 < spec.quorum < contributors:
        raise ValueError(f"{spec.describe()}: a quorum must be below the {contributors} machines")
    state = KeyState(key, spec)
    if spec.sparse:  # summed by id in the policy: the engine's dense accumulators do not serve it
        kind = SparseRowSum if spec.held is None else AsyncHeldRows if spec.asynchronous else HeldRows
        state.policy = kind(state, services)
        return state
    kind = AsyncStore if spec.asynchronous else QuorumSum if spec.quorum else SyncSum
    state.policy = kind(state, services)
    # The engine closes a round at this many pushes: the quorum, or every contributing machine.
    services.engine.declare(key, spec.nbytes, spec.dtype, spec.quorum or contributors)
    return state
