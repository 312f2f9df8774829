"""An embedding table held by the servers: ``ServerEmbedding``, a Keras layer looked up by id, stepped by the servers.

The TensorFlow counterpart of ``byteps.torch.ServerEmbedding``. The table
lives on byteps' servers, sharded by row id, and never whole on a worker:
a forward pass pulls only the rows its batch uses, a backward pass pushes
their gradients, and each server applies the table's optimizer to the rows
it holds once per round, after every worker's gradients of the round are
summed by id (docs/sparse.md, "Tables held by the servers"). Rows start
from the table's seed and their id, on the servers, the first time anyone
touches them. Example::

    emb = bps.ServerEmbedding(50_000_000, 16, name="user", optimizer="adagrad", lr=0.05)
    with tf.GradientTape() as tape:
        out = dense(tf.reduce_sum(emb(ids), 1))     # ids: int32 or int64 of any shape
        loss = ...
    tape = bps.DistributedGradientTape(tape)
    grads = tape.gradient(loss, dense.trainable_variables)   # the rows' gradients go to the servers
    optimizer.apply_gradients(zip(grads, dense.trainable_variables))

The layer has no variable for the table: the model's trainable variables
are the dense ones, which the user's optimizer steps. Each backward pass
that reaches a lookup's rows (``tape.gradient``) is one round of the table,
so every rank must do as many per step; a forward whose result no backward
reaches pushes nothing, and the next lookup waits for the servers to have
applied the last round. ``training=False`` lookups push nothing and may run
on one rank alone.

How the backward pass gets here: the rows come out of a
``tf.custom_gradient`` function of a scalar trainable ``tf.Variable`` kept
out of Keras's tracking (``layer.trainable_variables`` is empty). Reading
it makes a tape that watches accessed variables (the default; Keras's
``fit`` too) record the lookup, so its gradient function, which pushes the
rows' gradient, runs whenever the tape's backward pass reaches the rows,
whatever the sources asked for; it gives the variable a zero gradient. A
tape made with ``watch_accessed_variables=False`` records no lookup, and
no round happens. Eagerly the rows are pulled and pushed at once (numpy);
inside ``tf.function`` both are ``tf.py_function`` ops, and the push's
output feeds the variable's zero gradient so that no pruning drops it.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np
import tensorflow as tf

from byteps.common.frontend.held_embedding import HeldEmbedding
from byteps.tensorflow.which_keras import keras

__all__ = ["ServerEmbedding"]


class _Untracked:
    """Holds the layer's anchor variable where neither Keras nor TensorFlow's tracking looks."""

    def __init__(self, variable: tf.Variable) -> None:
        self.variable = variable


class ServerEmbedding(keras.layers.Layer):
    """``num_embeddings`` rows of ``embedding_dim`` float32 held by the servers as table ``name``.

    The arguments as :class:`~byteps.common.frontend.held_embedding.HeldEmbedding`
    (optimizer, learning rate, initial rows, averaging) takes them, which is
    ``table``, the framework-neutral half. Every rank must create the table
    alike. ``name`` is also the Keras layer's name ("/" made "_");
    ``table_name`` is the table's.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, name: str, optimizer: str = "sgd",
                 lr: float = 0.01, seed: int = 0, init_std: float = 0.01, eps: Optional[float] = None,
                 betas: Tuple[float, float] = (0.9, 0.999), initial_accumulator: float = 0.0,
                 average: bool = True, **kwargs: Any) -> None:
        table = HeldEmbedding(num_embeddings, embedding_dim, name, optimizer, lr, seed, init_std, eps, betas,
                              initial_accumulator, average)
        super().__init__(name=name.replace("/", "_"), **kwargs)  # Keras refuses "/" in a layer's name
        self.table, self.table_name = table, name
        self.num_embeddings, self.embedding_dim, self.held = num_embeddings, embedding_dim, table.held
        self._config = {"num_embeddings": num_embeddings, "embedding_dim": embedding_dim, "name": name,
                        "optimizer": optimizer, "lr": lr, "seed": seed, "init_std": init_std, "eps": eps,
                        "betas": tuple(betas), "initial_accumulator": initial_accumulator, "average": average}
        with tf.init_scope():
            self._anchor = _Untracked(tf.Variable(0.0, trainable=True, name=f"{name}.anchor"))

    def get_config(self) -> dict:
        config = dict(super().get_config())
        config.update(self._config)  # the table's name, not the layer's
        return config

    def compute_output_shape(self, input_shape: Any) -> Tuple[Any, ...]:
        return (*tuple(input_shape), self.embedding_dim)

    def lookup(self, ids: Any) -> tf.Tensor:
        """The rows ``ids`` as the servers hold them now (after the last round), without a gradient."""
        ids = self._ids(ids)
        if tf.executing_eagerly():
            rows = tf.constant(self.table.rows(ids.numpy().reshape(-1).astype(np.int64)))
        else:
            rows = self._fetch_op(tf.reshape(ids, [-1]))
        return tf.reshape(rows, tf.concat([tf.shape(ids), [self.embedding_dim]], 0))

    def call(self, ids: Any, training: Any = None) -> tf.Tensor:
        if training is False:
            return self.lookup(ids)
        ids = self._ids(ids)
        flat = tf.reshape(ids, [-1])
        eager = tf.executing_eagerly()
        flat_ids = flat.numpy().astype(np.int64) if eager else None

        @tf.custom_gradient
        def rows_of(anchor: tf.Tensor) -> Any:
            rows = tf.constant(self.table.rows(flat_ids)) if eager else self._fetch_op(flat)

            def gradient(upstream: tf.Tensor) -> tf.Tensor:
                if tf.executing_eagerly():
                    self.table.push(flat_ids, upstream.numpy())
                    return tf.zeros_like(anchor)
                pushed = tf.py_function(lambda i, g: self.table.push(i.numpy().astype(np.int64), g.numpy())
                                        or np.float32(0),
                                        [flat, tf.convert_to_tensor(upstream)], tf.float32,
                                        name="ServerEmbeddingPush")
                return tf.zeros_like(anchor) * pushed

            return rows, gradient

        rows = rows_of(tf.identity(self._anchor.variable))  # the read a tape records (watched variable)
        return tf.reshape(rows, tf.concat([tf.shape(ids), [self.embedding_dim]], 0))

    def _ids(self, ids: Any) -> tf.Tensor:
        if isinstance(ids, np.ndarray) or isinstance(ids, (list, tuple)):
            ids = np.asarray(ids)
            if ids.dtype not in (np.int64, np.int32):
                raise ValueError(f"ServerEmbedding({self.table_name!r}): ids must be an int64 or int32 tensor, not "
                                 f"{ids.dtype}")
            ids = tf.convert_to_tensor(ids)
        if not isinstance(ids, (tf.Tensor, tf.Variable)) or ids.dtype not in (tf.int64, tf.int32):
            what = getattr(getattr(ids, "dtype", None), "name", None) or type(ids).__name__
            raise ValueError(f"ServerEmbedding({self.table_name!r}): ids must be an int64 or int32 tensor, not {what}")
        return tf.convert_to_tensor(ids)

    def _fetch_op(self, flat: tf.Tensor) -> tf.Tensor:
        rows = tf.py_function(lambda i: self.table.rows(i.numpy().astype(np.int64)), [flat], tf.float32,
                              name="ServerEmbeddingLookup")
        rows.set_shape([flat.shape[0], self.embedding_dim])
        return rows

    def save(self, directory: str) -> None:
        """Every server writes its shard of the table (rows and optimizer state) to ``directory`` on its own
        file system. Call it on every rank, eagerly, between steps: rank 0 asks, after every rank's last round."""
        self._eagerly("save")
        self.table.save(directory)

    def load(self, directory: str) -> None:
        """The table as saved in ``directory``, by any number of servers. Call it on every rank, eagerly."""
        self._eagerly("load")
        self.table.load(directory)

    def flush(self) -> None:
        """Wait until the servers have applied the last round's gradients (the next lookup sees them)."""
        self.table.flush()

    def _eagerly(self, what: str) -> None:
        if not tf.executing_eagerly():
            raise RuntimeError(f"ServerEmbedding({self.table_name!r}): {what} runs eagerly: call it outside "
                               "tf.function, between steps")
