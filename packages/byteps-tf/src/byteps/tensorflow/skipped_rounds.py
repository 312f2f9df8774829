"""Backup workers (BYTEPS_BACKUP_WORKERS, docs/async.md): apply the round that closed without this worker.

Shared by every ``skip_step`` of byteps.tensorflow (``bps.skip_step`` for a
tape, the TF1 and the Keras 2 ``DistributedOptimizer``'s ``skip_step()``):
given the wrapper's last round (:class:`~byteps.tensorflow.gradients.SentRound`)
and how it applies gradients, it pulls the round's averages (nothing pushed)
and applies them when this worker is behind.

Eagerly that happens at once. In a TF1 graph it is an op, built at the
first skip (pull and apply, outside the graph's chain of byteps ops, so the
training op never runs it) and kept per graph, optimizer and variables; the
call runs it in ``session`` (or the default session)::

    train = opt.minimize(loss, global_step=step)       # opt: bps.DistributedOptimizer(tf.compat.v1.train...)
    with tf.compat.v1.Session() as session:
        ...
        for batch in batches:
            if opt.skip_step(session, global_step=step):
                continue                               # behind: the round's update is applied
            session.run(train, feed_dict=...)
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from byteps.tensorflow.gradients import SentRound

__all__ = ["apply_skipped_round"]

#: graph: {(id of the optimizer, the variables' refs): (the optimizer, the op)}
_graph_ops: weakref.WeakKeyDictionary[Any, Dict[Tuple[Any, ...], Tuple[Any, Any]]] = weakref.WeakKeyDictionary()


def apply_skipped_round(sent: Optional[SentRound], variables: Sequence[Any],
                        apply: Callable[[List[Tuple[Any, Any]]], Any], owner: Any, session: Any, what: str) -> bool:
    """True after applying the round that closed without this worker with ``apply(pairs)``; False (nothing
    done) when it is not behind, or the round cannot close early, or no round was sent yet.

    ``owner`` (the optimizer that applies) and ``variables`` key the op kept for a TF1 graph.
    """
    if sent is None:
        return False
    if tf.inside_function():
        raise RuntimeError(f"{what} runs before the step, outside tf.function: call it in the Python loop")
    if not tf.executing_eagerly():
        session = session if session is not None else tf.compat.v1.get_default_session()
        if session is None:
            raise ValueError(f"{what} in a TF1 graph runs the skipped round's update as an op: pass the Session "
                             "that runs the training op (session=...), or call it inside `with session.as_default():`")
    variables = list(variables)
    sent.check_variables(variables, what)
    if not sent.behind():
        return False
    if tf.executing_eagerly():
        pairs = [(g, v) for g, v in zip(sent.pull(), variables) if g is not None]
        if pairs:
            apply(pairs)
        return True
    session.run(_skip_op(sent, variables, apply, owner, session.graph))
    return True


def _skip_op(sent: SentRound, variables: List[Any], apply: Callable[[List[Tuple[Any, Any]]], Any], owner: Any,
             graph: Any) -> Any:
    ops = _graph_ops.setdefault(graph, {})
    key = (id(owner), *(v.ref() for v in variables))
    kept = ops.get(key)
    if kept is None:
        with graph.as_default():
            pairs = [(g, v) for g, v in zip(sent.pull(), variables) if g is not None]
            op = apply(pairs) if pairs else tf.no_op()
        kept = ops[key] = (owner, op)
    return kept[1]
