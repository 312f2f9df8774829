"""BytePS's asynchronous training (BYTEPS_ENABLE_ASYNC=1) on TensorFlow variables, eager or in a graph.

The exchange itself is framework-neutral
(:class:`byteps.common.frontend.async_training.ParameterExchange`): the
first one broadcasts rank 0's values into the servers' store, each later
one pushes a parameter's change (new - old), which the servers add, and
pulls the store, which replaces the worker's values (docs/async.md). What
is TensorFlow's here is moving variables in and out of it: numpy copies
go to byteps (which reads and writes them in place) and the servers'
values come back through ``assign``. Eagerly that happens at once; inside
``tf.function`` (``model.fit``'s step) or a TF1 graph it is one
``tf.py_function`` op (:func:`byteps.tensorflow.collectives.run_collective`,
ordered after the adapter's previous byteps op), fed by reads of the
variables and followed by their assigns.

A :class:`VariableExchange` finds the change in one of two ways:

* :meth:`VariableExchange.around` - the optimizers (Keras and TF1) own
  the update: values read before it, the update, values read after it
  (control dependencies order the three in a graph), then after - before
  goes out. The first call also broadcasts the values read before it.
* :meth:`VariableExchange.since_last` - ``DistributedGradientTape`` does
  not own the update (the user's optimizer applies the gradients after
  ``gradient()`` returns): it pushes the values now minus the values it
  left in the variables at its previous call, i.e. the update applied in
  between (see :mod:`byteps.tensorflow.gradient_tape`).

A variable is exchanged by one kind of wrapper only: a variable that both a
DistributedGradientTape and a DistributedOptimizer exchange would have its
update counted twice, so that is refused with a ValueError naming both.
Wrappers that may see several variable lists (the tape's sources, a TF1
optimizer's var lists) take one exchange per list and refuse lists that
overlap (:class:`ExchangesByList`).

Example: a tape loop leaves its last update local; push it at the end::

    for x, y in batches:
        step(x, y)                                   # DistributedGradientTape + a plain optimizer
    byteps.tensorflow.async_training.push_tape_updates()
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from byteps.common import api
from byteps.common.frontend import after_shutdown
from byteps.common.frontend.async_training import (
    ParameterExchange,
    Snapshots,
    async_enabled,
    check_async_compression,
)
from byteps.common.frontend.process_sets import global_process_set
from byteps.tensorflow.collectives import run_collective
from byteps.tensorflow.compression import Compression

__all__ = ["NUMPY_SNAPSHOTS", "VariableExchange", "ExchangesByList", "asynchronous", "as_tf_variable",
           "is_variable", "tape_exchange", "push_tape_updates"]

#: How the exchange copies and subtracts: on the numpy copies of the variables.
NUMPY_SNAPSHOTS = Snapshots(copy=np.copy, subtract=np.subtract, zeros_like=np.zeros_like)

#: The dtypes the servers add deltas of (the exchange sums them in the variable's own dtype).
_EXCHANGED_DTYPES = (tf.float16, tf.float32, tf.float64)


def asynchronous(wrapper: str, compression: Any, compression_params: Any, process_set: Any) -> bool:
    """Whether ``wrapper`` trains asynchronously (byteps initialized, BYTEPS_ENABLE_ASYNC=1).

    In that mode what it cannot do is refused here: compression (the deltas
    go uncompressed) and a process set other than the global one (every
    worker's delta lands on the same servers' parameters).
    """
    if not (api.is_initialized() and async_enabled()):
        return False
    check_async_compression(compression_params, compression is Compression.none)
    if process_set is not None and process_set is not global_process_set \
            and getattr(process_set, "process_set_id", None) != 0:
        raise ValueError(f"{wrapper}: BYTEPS_ENABLE_ASYNC=1 exchanges parameters over every worker: drop "
                         "process_set or unset BYTEPS_ENABLE_ASYNC")
    return True


def is_variable(value: Any) -> bool:
    """A ``tf.Variable`` or a Keras variable (on TensorFlow, a wrapper of one)."""
    if isinstance(value, tf.Variable):
        return True
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(value, keras.Variable)


def as_tf_variable(variable: Any) -> tf.Variable:
    """The ``tf.Variable`` behind ``variable`` (a Keras variable's own), read and assigned without casts."""
    if isinstance(variable, tf.Variable):
        return variable
    inner = getattr(variable, "_value", None)  # Keras' TensorFlow backend keeps its tf.Variable here
    if not isinstance(inner, tf.Variable):
        raise TypeError(f"BYTEPS_ENABLE_ASYNC=1 exchanges tf.Variable and Keras variables, got "
                        f"{type(variable).__name__}")
    return inner


class VariableExchange:
    """The asynchronous exchange of a fixed list of variables, for one wrapper of kind ``owner``.

    Its names are ``<prefix>.<i>``, or ``<prefix>#<k>.<i>`` for the k-th
    later exchange made with the same prefix in this process (a second
    optimizer of the same name, e.g. after ``compile`` again): each gets
    its own keys on the servers and starts with its own broadcast. Every
    rank makes its exchanges in the same order, so the names agree.
    """

    def __init__(self, prefix: str, variables: Sequence[Any], owner: str) -> None:
        self.variables: List[tf.Variable] = [as_tf_variable(v) for v in variables]
        for i, variable in enumerate(self.variables):
            if variable.dtype.base_dtype not in _EXCHANGED_DTYPES:
                raise ValueError(f"BYTEPS_ENABLE_ASYNC=1: variable {i} ({variable.name}) is "
                                 f"{variable.dtype.base_dtype.name}; asynchronous training exchanges float16, "
                                 "float32 and float64 variables")
        _claim(self.variables, owner)
        uses = _prefix_uses.get(prefix, 0)
        _prefix_uses[prefix] = uses + 1
        base = f"{prefix}#{uses}" if uses else prefix
        self.names = [f"{base}.{i}" for i in range(len(self.variables))]
        self.parameters = ParameterExchange(self.names, NUMPY_SNAPSHOTS, at_commit=self._take_store)
        self._previous: Optional[Dict[str, np.ndarray]] = None  # since_last(): the values it left last time
        _live.add(self)

    def around(self, update: Callable[[], Any]) -> Optional[tf.Operation]:
        """Run ``update()`` (the local step), then exchange its change; in a graph, the op doing all of it.

        The first call first broadcasts the values read before the update
        into the servers' store (rank 0's win); its delta is this rank's
        own update, as every later one.
        """
        before = [_read(v) for v in self.variables]
        with tf.control_dependencies(before):  # a TF1 graph has no automatic order: reads before the update
            result = update()
        with tf.control_dependencies(_ops(result)):
            after = [_read(v) for v in self.variables]
        return self._assign(self._run(self._exchange_update, [*before, *after]))

    def since_last(self) -> Optional[tf.Operation]:
        """Push what changed the variables since this exchange's previous call; assign the servers' values.

        The first call broadcasts the values (rank 0's into the store and
        into every rank's variables). Returns None eagerly, else the op.
        """
        return self._assign(self._run(self._exchange_since_last, [_read(v) for v in self.variables]))

    def reset(self) -> None:
        """A new job (after shutdown and init): its servers hold nothing, so start with a broadcast again."""
        self.parameters = ParameterExchange(self.names, self.parameters.ops, at_commit=self._take_store)
        self._previous = None

    def _take_store(self) -> bool:
        """At an elastic ``state.commit()`` (eager): the servers' values into the variables.

        A tape's exchange pushes the update applied since its last
        ``gradient()`` call (it would push it at the next one) and returns
        True, so the commit calls it again once every rank has pushed: what
        is committed then holds every rank's update, and the next call
        pushes only what comes after. An optimizer's exchange has nothing
        unpushed: it exchanges a zero change.
        """
        if self._previous is not None:
            self.since_last()
            return True
        self.around(lambda: None)
        return False

    # The bodies run eagerly: directly, or inside the py_function op of a graph.

    def _exchange_update(self, *values: tf.Tensor) -> List[np.ndarray]:
        count = len(self.names)
        before = dict(zip(self.names, (_array(v) for v in values[:count])))
        after = dict(zip(self.names, (_array(v) for v in values[count:])))
        if not self.parameters.started:
            self.parameters.start(self.parameters.snapshot(before))
        self.parameters.exchange(before, after)
        return [after[name] for name in self.names]

    def _exchange_since_last(self, *values: tf.Tensor) -> List[np.ndarray]:
        current = dict(zip(self.names, (_array(v) for v in values)))
        if not self.parameters.started:
            self.parameters.start(current)
        else:
            self.parameters.exchange(self._previous, current)
        self._previous = self.parameters.snapshot(current)
        return [current[name] for name in self.names]

    def _run(self, body: Callable[..., List[np.ndarray]], inputs: List[tf.Tensor]) -> List[Any]:
        # As every other byteps op: a lost process comes out of a graph as an AbortedError that elastic
        # training's run() recognizes (JobLostError), not as py_function's UnknownError.
        return run_collective(body, inputs, [v.dtype.base_dtype for v in self.variables],
                              [v.shape for v in self.variables])

    def _assign(self, values: List[Any]) -> Optional[tf.Operation]:
        assigns = [variable.assign(tf.convert_to_tensor(value, dtype=variable.dtype.base_dtype))
                   for variable, value in zip(self.variables, values)]
        return None if tf.executing_eagerly() else tf.group(*assigns)


def _read(variable: tf.Variable) -> tf.Tensor:
    # A resource variable's read is a snapshot: a later update writes elsewhere while the read is alive.
    return tf.identity(variable.read_value())


def _ops(result: Any) -> List[Any]:
    """What a graph's reads after the update wait for: the update's op or tensor, when it returns one."""
    if tf.executing_eagerly():
        return []
    return [result] if isinstance(result, (tf.Operation, tf.Tensor)) else []


def _array(value: Any) -> np.ndarray:
    """A writable numpy copy, which byteps fills in place."""
    return np.array(value.numpy() if hasattr(value, "numpy") else value)


# Which kind of wrapper exchanges each variable: id of its tf.Variable -> (kind, weak reference to it).
_claims: Dict[int, Tuple[str, weakref.ref]] = {}

# How many exchanges each prefix named so far (never reset: names stay unique for the process).
_prefix_uses: Dict[str, int] = {}

# Every exchange, to start again (with a broadcast) in the next job of this process.
_live: weakref.WeakSet[VariableExchange] = weakref.WeakSet()


def _claim(variables: Sequence[tf.Variable], owner: str) -> None:
    for variable in variables:
        held = _claims.get(id(variable))
        if held is not None and held[0] != owner and held[1]() is variable:
            raise ValueError(f"BYTEPS_ENABLE_ASYNC=1: variable {variable.name} is exchanged by a {held[0]} "
                             f"already; a {owner} exchanging it too would count its updates twice. Use one "
                             "of them (DistributedGradientTape with a plain optimizer, or DistributedOptimizer "
                             "with a plain tape)")
    for variable in variables:
        _claims[id(variable)] = (owner, weakref.ref(variable))


class ExchangesByList:
    """A wrapper's exchanges when it may see several lists of variables (tape sources, TF1 var lists).

    One exchange per distinct list, ``<prefix>.<k>`` in order of first
    use. Lists must be equal or disjoint: a variable in two lists would
    have two copies on the servers, each pulled over the other's updates
    (and the tape would push the other's pulls as its own change).
    """

    def __init__(self, prefix: str, owner: str) -> None:
        self.prefix, self.owner = prefix, owner
        self.by_list: Dict[Tuple[int, ...], VariableExchange] = {}
        self._list_of: Dict[int, Tuple[int, ...]] = {}  # each variable's list

    def get(self, variables: Sequence[Any]) -> VariableExchange:
        unique: Dict[int, tf.Variable] = {}
        for variable in variables:
            tf_variable = as_tf_variable(variable)
            unique.setdefault(id(tf_variable), tf_variable)
        key = tuple(unique)
        exchange = self.by_list.get(key)
        if exchange is None:
            shared = [v.name for i, v in unique.items() if i in self._list_of]
            if shared:
                raise ValueError(f"{self.owner} (BYTEPS_ENABLE_ASYNC=1): variables {shared} were exchanged "
                                 "before as part of another list of variables; their updates would be counted "
                                 "apart or twice. Pass the same list every step (or lists with no variable in "
                                 "common)")
            exchange = VariableExchange(f"{self.prefix}.{len(self.by_list)}", list(unique.values()), self.owner)
            self.by_list[key] = exchange
            self._list_of.update((i, key) for i in unique)
        return exchange


# DistributedGradientTape's exchanges (kept across jobs: the same code numbers them alike on every rank).
_tape_exchanges = ExchangesByList("DistributedGradientTape", "DistributedGradientTape")


def tape_exchange(variables: Sequence[Any]) -> VariableExchange:
    """DistributedGradientTape's exchange for these source variables (the same list every step)."""
    return _tape_exchanges.get(variables)


def push_tape_updates() -> None:
    """Exchange every DistributedGradientTape's last update now, e.g. after the training loop (eager).

    In asynchronous training the tape pushes an update at the next
    ``gradient()`` call; the last one stays in this worker's variables
    until this is called. Every rank calls it, after the same steps.
    """
    for exchange in _tape_exchanges.by_list.values():
        exchange.since_last()


def _reset_all() -> None:
    for exchange in list(_live):
        exchange.reset()


after_shutdown(_reset_all)
