"""Which server sums each partition: hashed keys, or bytes balanced greedily.

BytePS places a partition by hashing its key (BYTEPS_KEY_HASH_FN): ``djb2``
(its default) and ``sdbm`` over the key's decimal string, or ``built_in``,
the C++ standard library's ``std::hash<std::string>`` of that string. A hash
knows nothing of sizes, so with a few large tensors one server can end up
with far more bytes than another. BYTEPS_SERVER_ASSIGNMENT=balanced (our
default) instead gives each partition to the server with the fewest bytes so
far; ``hash`` keeps BytePS's placement.

Every worker process must place every key on the same server, or their
pushes for that key meet on different servers and never sum. A worker knows
nothing of the others' state, so a placement may depend only on what is
identical in every worker: the order in which tensors are declared (their
ids) and each tensor's size. Hence:

* ``plan(..., balanced=True)`` must be called exactly when a tensor is
  declared with its size known, in declaration order; its greedy choice
  then depends only on the sizes of the tensors declared before it, which
  every worker has seen in the same order.
* A tensor declared without a size is planned at its first push_pull, whose
  moment relative to other declarations can differ between workers; it must
  use ``plan(..., balanced=False)``: hash placement, which depends on nothing
  but its own keys, and which never feeds the balancing counters either.
* Workers that disagree on a tensor's size (a user's mistake, which fails
  that tensor's first round on every worker) fed the counters different
  bytes; each then calls :meth:`ServerAssigner.unbalance` for it, which
  takes its bytes out again, so the tensors after it are placed alike.
  Only the tensors planned before a worker learns of that failure can still
  differ (a program that starts more push_pulls without waiting).

Example::

    assigner = ServerAssigner(num_servers=4, partition_bytes=4096000)
    plan = assigner.plan(tensor_id=0, nbytes=8192000, itemsize=4)   # 2 partitions, 2 servers
    assigner.load()                                                # [4096000, 4096000, 0, 0]
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Tuple

from byteps.common.partition import MAX_PARTITIONS, PartitionPlan

__all__ = ["HASH_FNS", "ASSIGNMENTS", "djb2", "sdbm", "built_in", "key_hash", "hash_server", "ServerAssigner"]

HASH_FNS = ("djb2", "sdbm", "built_in")
ASSIGNMENTS = ("balanced", "hash")

_MASK64 = (1 << 64) - 1


def djb2(key: int) -> int:
    """Bernstein's hash (h = 33h + c from 5381) of the key's decimal digits, in 64 bits, as BytePS."""
    h = 5381
    for c in str(key).encode():
        h = (h * 33 + c) & _MASK64
    return h


def sdbm(key: int) -> int:
    """The sdbm hash (h = 65599h + c from 0) of the key's decimal digits, in 64 bits, as BytePS."""
    h = 0
    for c in str(key).encode():
        h = (h * 65599 + c) & _MASK64
    return h


_MURMUR_MUL = 0xC6A4A7935BD1E995
_STD_HASH_SEED = 0xC70F6907


def _shift_mix(v: int) -> int:
    return v ^ (v >> 47)


def built_in(key: int) -> int:
    """``std::hash<std::string>`` of the key's decimal digits as GCC's libstdc++ computes it on 64-bit.

    BytePS calls the standard library's hash, whose value the C++ standard
    leaves to each library; BytePS is built with GCC on Linux, whose
    libstdc++ uses a MurmurHash2 variant (64-bit words, little-endian) with
    a fixed seed. We compute the same so a ``built_in`` job places keys as
    BytePS on Linux does, on every platform.
    """
    data = str(key).encode()
    h = _STD_HASH_SEED ^ ((len(data) * _MURMUR_MUL) & _MASK64)
    whole = len(data) - len(data) % 8
    for i in range(0, whole, 8):
        word = int.from_bytes(data[i:i + 8], "little")
        h = (h ^ ((_shift_mix((word * _MURMUR_MUL) & _MASK64) * _MURMUR_MUL) & _MASK64)) * _MURMUR_MUL & _MASK64
    if whole < len(data):
        h = ((h ^ int.from_bytes(data[whole:], "little")) * _MURMUR_MUL) & _MASK64
    h = (_shift_mix(h) * _MURMUR_MUL) & _MASK64
    return _shift_mix(h)


_HASHES: Dict[str, Callable[[int], int]] = {"djb2": djb2, "sdbm": sdbm, "built_in": built_in}


def key_hash(key: int, hash_fn: str = "djb2") -> int:
    """The 64-bit hash of ``key`` by one of :data:`HASH_FNS`."""
    try:
        return _HASHES[hash_fn](key)
    except KeyError:
        raise ValueError(f"unknown key hash function {hash_fn!r} (BYTEPS_KEY_HASH_FN); "
                         f"known: {', '.join(HASH_FNS)}") from None


def hash_server(key: int, num_servers: int, hash_fn: str = "djb2") -> int:
    """The server BytePS would place ``key`` on: its hash modulo the number of servers."""
    return key_hash(key, hash_fn) % num_servers


class ServerAssigner:
    """Places every tensor's partitions on servers, once per tensor id, for one worker process.

    ``mode`` is BYTEPS_SERVER_ASSIGNMENT (``balanced`` or ``hash``),
    ``hash_fn`` is BYTEPS_KEY_HASH_FN. In ``balanced`` mode, and only for
    ``plan(..., balanced=True)``, each partition goes to the server with the
    fewest balanced bytes so far; ties go to the server holding fewest of
    this tensor's partitions (so they sum in parallel), then to the lowest
    index. A tensor's partitions are placed largest first (index order: only
    the last can be smaller), which keeps the greedy within one partition of
    even. Everything else is hash placement. See the module docstring for
    when ``balanced=True`` is safe. Thread-safe.
    """

    def __init__(self, num_servers: int, partition_bytes: int, mode: str = "balanced",
                 hash_fn: str = "djb2") -> None:
        if num_servers < 1:
            raise ValueError(f"server assignment needs at least one server, got {num_servers}")
        if mode not in ASSIGNMENTS:
            raise ValueError(f"unknown server assignment {mode!r} (BYTEPS_SERVER_ASSIGNMENT); "
                             f"known: {', '.join(ASSIGNMENTS)}")
        key_hash(0, hash_fn)  # an unknown name fails here, not at the first push_pull
        self.num_servers = num_servers
        self.partition_bytes = partition_bytes
        self.mode = mode
        self.hash_fn = hash_fn
        self._lock = threading.Lock()
        self._plans: Dict[int, Tuple[int, int, PartitionPlan]] = {}  # id -> (nbytes, itemsize, plan)
        self._load = [0] * num_servers       # every planned byte, for load()
        self._balanced = [0] * num_servers   # bytes of balanced placements only: the same in every worker
        self._counted: set = set()           # the ids whose partitions are in _balanced

    def plan(self, tensor_id: int, nbytes: int, itemsize: int, balanced: bool = True) -> PartitionPlan:
        """The tensor's partition plan, computed at the first call and memoized.

        A later call returns the same plan whatever ``balanced`` says; a
        later call with another ``nbytes`` or ``itemsize`` raises ValueError
        naming both, since the keys already live on their servers.
        """
        with self._lock:
            known = self._plans.get(tensor_id)
            if known is not None:
                old_nbytes, old_itemsize, plan = known
                if (old_nbytes, old_itemsize) != (nbytes, itemsize):
                    raise ValueError(
                        f"tensor {tensor_id} was planned with {old_nbytes} bytes of {old_itemsize}-byte elements, "
                        f"now it has {nbytes} bytes of {itemsize}-byte elements; a tensor's size "
                        "and element size are fixed at its first declaration or push_pull")
                return plan
            if self.mode == "balanced" and balanced:
                plan = PartitionPlan.build(tensor_id, nbytes, itemsize, self.partition_bytes, self.num_servers,
                                           self._least_loaded_choice())
                for part in plan.partitions:
                    self._balanced[part.server] += part.nbytes
                self._counted.add(tensor_id)
            else:
                plan = PartitionPlan.build(tensor_id, nbytes, itemsize, self.partition_bytes, self.num_servers,
                                           self._hash_choice)
            for part in plan.partitions:
                self._load[part.server] += part.nbytes
            self._plans[tensor_id] = (nbytes, itemsize, plan)
            return plan

    def unbalance(self, tensor_id: int) -> None:
        """Take a balanced tensor's bytes out of the balancing counters (once; its plan stays): its first round
        failed on every worker, which may have planned it with different sizes."""
        with self._lock:
            if tensor_id in self._counted:
                self._counted.discard(tensor_id)
                for part in self._plans[tensor_id][2].partitions:
                    self._balanced[part.server] -= part.nbytes

    def export(self) -> Dict[str, Any]:
        """Every plan (``{id: [nbytes, itemsize, [server of each partition]]}``) and the balancing counters:
        what a worker that missed declarations (a rank that joined early) adopts with :meth:`adopt`."""
        with self._lock:
            plans = {str(tensor_id): [nbytes, itemsize, [part.server for part in plan.partitions]]
                     for tensor_id, (nbytes, itemsize, plan) in self._plans.items()}
            return {"plans": plans, "balanced": list(self._balanced)}

    def adopt(self, state: Dict[str, Any]) -> None:
        """Take the plans this worker lacks, and the balancing counters, from another worker's export()."""
        with self._lock:
            for text, (nbytes, itemsize, servers) in state["plans"].items():
                tensor_id = int(text)
                if tensor_id in self._plans:
                    continue
                plan = PartitionPlan.build(tensor_id, nbytes, itemsize, self.partition_bytes, self.num_servers,
                                           lambda key, size, servers=servers: servers[key & (MAX_PARTITIONS - 1)])
                for part in plan.partitions:
                    self._load[part.server] += part.nbytes
                self._plans[tensor_id] = (nbytes, itemsize, plan)
            self._balanced = list(state["balanced"])

    def load(self) -> List[int]:
        """Bytes placed on each server so far, by every plan (balanced or hashed)."""
        with self._lock:
            return list(self._load)

    def _hash_choice(self, key: int, nbytes: int) -> int:
        return hash_server(key, self.num_servers, self.hash_fn)

    def _least_loaded_choice(self) -> Callable[[int, int], int]:
        """A chooser for one tensor: the least balanced bytes; ties: fewest of this tensor's partitions."""
        pending = list(self._balanced)          # the counters plus this tensor's partitions placed so far
        mine = [0] * self.num_servers           # this tensor's partitions per server

        def choose(key: int, nbytes: int) -> int:
            server = min(range(self.num_servers), key=lambda s: (pending[s], mine[s], s))
            pending[server] += nbytes
            mine[server] += 1
            return server

        return choose
