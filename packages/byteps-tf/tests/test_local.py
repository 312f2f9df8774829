"""One worker process, no launcher: no scheduler or server, push_pull is a copy (as in BytePS).

Checks the API surface, argument errors and the Keras wrapper's plumbing
(save/load, backward passes) without paying for a job; the multi-worker
behaviour is in test_jobs.py.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

DTYPES = [tf.float16, tf.float32, tf.float64, tf.bfloat16, tf.int32, tf.int64]



@pytest.mark.parametrize("dtype", DTYPES)
def test_single_process_ops_are_the_identity(bps, dtype):
    assert (bps.size(), bps.rank(), bps.local_size(), bps.local_rank()) == (1, 0, 1, 0)
    x = tf.cast(tf.reshape(tf.range(12) - 5, [3, 4]), dtype)
    graph = tf.function(lambda t: (bps.allreduce(t, op=bps.Sum), bps.broadcast(t, 0), bps.allgather(t)))
    for result in (bps.push_pull(x, name=f"local.{dtype.name}"), bps.allreduce(x, op=bps.Sum),
                   bps.broadcast(x, 0, name=f"local.b.{dtype.name}"), bps.allgather(x), *graph(x)):
        assert result.dtype == dtype and result.shape == (3, 4)
        assert np.array_equal(tf.cast(result, tf.float64).numpy(), tf.cast(x, tf.float64).numpy())


def test_single_process_helpers(bps):
    assert bps.join() == 0
    bps.barrier()
    obj = {"a": [1, 2]}
    assert bps.broadcast_object(obj) is obj
    v = tf.Variable(tf.ones([2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(bps.allreduce(v * 3.0, name="local.grad"))
    assert tape.gradient(loss, v).numpy().tolist() == [3.0, 3.0]
    slices = tf.IndexedSlices(tf.ones([2, 2]), tf.constant([0, 3]), dense_shape=tf.constant([4, 2]))
    reduced = bps.allreduce(slices, name="local.slices")
    assert isinstance(reduced, tf.IndexedSlices) and reduced.indices.numpy().tolist() == [0, 3]
    # Horovod's rules for IndexedSlices: an integer average is TensorFlow's true division; only Average/Sum
    int_slices = tf.IndexedSlices(tf.fill([1, 2], 3), tf.constant([1]), dense_shape=tf.constant([4, 2]))
    averaged = bps.allreduce(int_slices, name="local.int.slices")
    assert averaged.values.dtype == tf.float64 and averaged.values.numpy().tolist() == [[3.0, 3.0]]
    with pytest.raises(NotImplementedError, match="only Average and Sum"):
        bps.allreduce(slices, op=bps.Max)
    scaled = bps.allreduce(slices, op=bps.Sum, prescale_factor=0.5, postscale_factor=3.0, name="local.scaled")
    assert scaled.values.numpy().tolist() == [[1.5, 1.5]] * 2 and scaled.indices.numpy().tolist() == [0, 3]
    assert bps.util._executing_eagerly() and bps._executing_eagerly()
    assert int(bps.rank_op()) == 0 and int(bps.size_op()) == 1 and int(bps.local_size_op()) == 1
    with tf.Graph().as_default():
        built = bps.local_rank_op()          # read when it runs
        with tf.compat.v1.Session() as session:
            assert session.run(built) == 0
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * 2.0)
    tape = bps.DistributedGradientTape(tape)
    assert isinstance(tape, tf.GradientTape)
    assert tape.gradient(loss, [v])[0].numpy().tolist() == [2.0, 2.0]  # one worker: nothing is sent


def test_errors_are_clear(bps):
    with pytest.raises(ValueError, match=r"unsupported dtype complex64; byteps reduces float32, float64, float16, "
                                         r"bfloat16, int32, int64"):
        bps.allreduce(tf.ones([3], tf.complex64))
    traced = tf.function(lambda t: bps.push_pull(t, name="c128"))
    with pytest.raises(ValueError, match="unsupported dtype complex128"):
        traced(tf.ones([2], tf.complex128))
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        bps.allreduce(tf.ones(3), name="")
    assert bps.allreduce(tf.constant([1.0, -2.0]), op=bps.Adasum).numpy().tolist() == [1.0, -2.0]   # one rank
    with pytest.raises(NotImplementedError, match="floating-point"):
        bps.allreduce(tf.ones(3, tf.int32), op=bps.Adasum)
    assert bps.allreduce(tf.constant([1.0, -2.0]), op=bps.Max).numpy().tolist() == [1.0, -2.0]   # one rank
    with pytest.raises(ValueError, match="supersedes"):
        bps.allreduce(tf.ones(3), average=False, op=bps.Sum)
    assert bps.allreduce(tf.fill([2], 3), prescale_factor=0.5).numpy().tolist() == [1, 1]   # as Horovod: truncated
    with pytest.raises(ValueError, match="root_rank"):
        bps.broadcast(tf.ones(2), root_rank=1)
    with pytest.raises(ValueError, match="process_set must be a ProcessSet"):
        bps.broadcast_variables([], 0, process_set="odd")
    bps.allreduce(tf.ones(2), process_set=bps.global_process_set)
    with pytest.raises(ValueError, match="at least one dimension"):
        bps.allgather(tf.constant(1.0))
    with pytest.raises(TypeError, match="tf.GradientTape"):
        bps.DistributedGradientTape(object())
    with pytest.raises(TypeError, match="Keras 3 optimizer or a tf.compat.v1.train.Optimizer"):
        bps.DistributedOptimizer(object())
    with pytest.raises(RuntimeError, match="TF1 graph"):
        bps.broadcast_global_variables(0)


def test_not_initialized_is_a_clear_error():
    import byteps.tensorflow as bps

    bps.shutdown()
    with pytest.raises(ValueError, match="init"):
        bps.push_pull(tf.ones(2), name="x")


def test_tf1_graph_mode_broadcast_global_variables(bps):
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=tf.constant([1.0, 2.0]))
        op = bps.broadcast_global_variables(0)
        total = bps.allreduce(v.read_value(), op=bps.Sum, name="tf1.v")
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(op)
            assert session.run(total).tolist() == [1.0, 2.0]


def test_keras_optimizer_save_load_and_backward_passes(bps, tmp_path):
    import byteps.keras as kbps

    x = np.random.default_rng(0).random((32, 4)).astype("float32")
    y = (x.sum(axis=1) > 2).astype("int32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    optimizer = kbps.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                          average_aggregated_gradients=True)
    assert isinstance(optimizer, keras.optimizers.SGD) and type(optimizer).__name__ == "SGD"
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[kbps.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert int(optimizer.iterations.numpy()) == 2  # 4 passes, 2 updates
    path = str(tmp_path / "model.keras")
    model.save(path)
    plain = keras.models.load_model(path)
    assert type(plain.optimizer) is keras.optimizers.SGD
    # the accumulators are not optimizer variables: Keras restores the state (it skips all of it on a count mismatch)
    assert len(plain.optimizer.variables) == len(optimizer.variables)
    assert int(plain.optimizer.iterations.numpy()) == 2
    loaded = kbps.load_model(path, backward_passes_per_step=2)
    assert isinstance(loaded.optimizer, keras.optimizers.SGD) and type(loaded.optimizer) is not keras.optimizers.SGD
    assert int(loaded.optimizer.iterations.numpy()) == 2 and loaded.optimizer._byteps_passes == 2
    with pytest.raises(ValueError, match="already a DistributedOptimizer"):
        kbps.DistributedOptimizer(loaded.optimizer)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        kbps.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=0)


def test_public_api_is_complete():
    import byteps.keras
    import byteps.tensorflow as bps
    import byteps.tensorflow.keras as kbps

    for module in (bps, kbps):
        for name in module.__all__:
            assert getattr(module, name) is not None, name
    horovod_tf = ["init", "shutdown", "size", "rank", "local_size", "local_rank", "allreduce", "broadcast",
                  "broadcast_variables", "broadcast_global_variables", "DistributedGradientTape",
                  "DistributedOptimizer", "Average", "Sum", "Compression", "allgather", "broadcast_object"]
    assert set(horovod_tf) <= set(bps.__all__)
    horovod_keras = ["init", "size", "rank", "DistributedOptimizer", "broadcast_global_variables", "allreduce",
                     "broadcast", "load_model", "callbacks"]
    assert set(horovod_keras) <= set(kbps.__all__)
    assert byteps.keras.DistributedOptimizer is kbps.DistributedOptimizer
    for name in ("BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateWarmupCallback",
                 "LearningRateScheduleCallback"):
        assert getattr(byteps.keras.callbacks, name) is getattr(kbps.callbacks, name)
    assert bps.Compression.none is not bps.Compression.fp16
