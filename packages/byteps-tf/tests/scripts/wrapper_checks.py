"""Worker script: the gradient wrappers' process sets, the TF1 optimizer's backward passes and scale factors.

Run under bpslaunch with 3 ranks, or 4 (tests/matrix: two machines of two) (Keras 3, or Keras 2 with
TF_USE_LEGACY_KERAS=1: ``which_keras`` picks the Keras the wrappers wrap).
Every rank computes what it expects with numpy, from every rank's inputs:

* ``process_set=`` on DistributedGradientTape (dense, Sum, predivide,
  IndexedSlices), the Keras DistributedOptimizer (``apply_gradients``
  and ``model.fit``), the TF1 DistributedOptimizer and
  broadcast_variables, eagerly and in ``tf.function``: the set {0, 2}
  averages over its two ranks, rank 1 (outside) keeps its own gradients,
  as Horovod's wrappers do, and gets a ValueError naming the set from
  broadcast_variables;
* the TF1 DistributedOptimizer with ``backward_passes_per_step=2``
  (summed and averaged passes, ``global_step`` counting passes) eagerly,
  in ``tf.function`` and in a TF1 graph;
* ``prescale_factor``/``postscale_factor`` on IndexedSlices and on
  ``grouped_allreduce``, over every rank and over a set;
* ``op=Adasum``: refused at the call with 3 ranks (not a power of two; with 4 not refused);
  combined over the set {0, 2} by the tape, eagerly and in ``tf.function``;
* after the errors, a collective and a barrier on every rank still work.

Prints ``OK <check>`` per check and ``ALL OK <n>``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from check_runner import Checks, assert_close, expect_error

import byteps.tensorflow as bps
from byteps.tensorflow.which_keras import KERAS2, keras

checks = Checks()
SET = [0, 2]
evens = None  # the process set of SET, added in main()


def x_of(rank: int) -> np.ndarray:
    return (np.arange(4) + 10 * rank + 1).astype(np.float32)


def expected_mean(rank: int, ranks=SET) -> np.ndarray:
    """What a rank gets from an average over the set: its own gradient when outside it."""
    return np.mean([x_of(k) for k in ranks], axis=0) if rank in ranks else x_of(rank)


def tape_gradient(variable: tf.Variable, x: tf.Tensor, **options) -> tf.Tensor:
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(variable * x)
    return bps.DistributedGradientTape(tape, **options).gradient(loss, [variable])[0]


def run_once(how: str, body, *args) -> None:
    """``body(*args)`` eagerly, or traced into a ``tf.function`` (whose result is dropped: it may be an op)."""
    def call(*inputs):
        body(*inputs)

    (call if how == "eager" else tf.function(call))(*args)


def tape_process_sets():
    r = bps.rank()
    w = tf.Variable(tf.ones([4]))
    x = tf.constant(x_of(r))
    in_graph = tf.function(lambda t: tape_gradient(w, t, process_set=evens))
    for how, gradient in (("eager", tape_gradient(w, x, process_set=evens)), ("tf.function", in_graph(x)),
                          ("tf.function again", in_graph(x))):
        assert_close(gradient, expected_mean(r), f"tape average over the set, {how}")
    summed = tape_gradient(w, x, process_set=evens, op=bps.Sum)
    assert_close(summed, np.sum([x_of(k) for k in SET], axis=0) if r in SET else x_of(r), "tape Sum over the set")
    predivided = tape_gradient(w, x, process_set=evens, gradient_predivide_factor=2.0)
    assert_close(predivided, expected_mean(r), "tape predivide over the set (divides by the set's size)")
    # IndexedSlices: each rank looks up rows [r, 4] with weight r + 1; the set gathers its ranks' slices.
    table = tf.Variable(tf.ones([5, 2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [r, 4]) * float(r + 1))
    gradient = bps.DistributedGradientTape(tape, process_set=evens).gradient(loss, [table])[0]
    assert isinstance(gradient, tf.IndexedSlices), type(gradient)
    want = np.zeros([5, 2], np.float32)
    for k in (SET if r in SET else [r]):
        want[[k, 4]] += (k + 1) / (len(SET) if r in SET else 1)
    assert_close(tf.convert_to_tensor(gradient), want, "tape IndexedSlices over the set")
    # The global set is every rank.
    everyone = tape_gradient(w, x, process_set=bps.global_process_set)
    assert_close(everyone, np.mean([x_of(k) for k in range(bps.size())], axis=0), "tape over the global set")


def keras_optimizer_process_sets():
    r = bps.rank()
    families = {"optimizers.SGD": keras.optimizers.SGD}
    if KERAS2:
        families["optimizers.legacy.SGD"] = keras.optimizers.legacy.SGD
    for family, make in families.items():
        for how in ("eager", "tf.function"):
            w = tf.Variable(tf.ones([4]))
            opt = bps.DistributedOptimizer(make(1.0), process_set=evens, name=f"kps.{family}.{how}")
            run_once(how, lambda gradient, opt=opt, w=w: opt.apply_gradients([(gradient, w)]), tf.constant(x_of(r)))
            assert_close(w, 1.0 - expected_mean(r), f"Keras {family} apply_gradients over the set, {how}")
        # model.fit: one batch of 8 rows per rank, mean squared error against zeros, no bias.
        inputs = np.random.default_rng(r).normal(size=(8, 3)).astype(np.float32)
        model = keras.Sequential([keras.Input((3,)),
                                  keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
        model.compile(optimizer=bps.DistributedOptimizer(make(0.1), process_set=evens, name=f"fit.{family}"),
                      loss="mse")
        model.fit(inputs, np.zeros((8, 1), np.float32), batch_size=8, epochs=1, shuffle=False, verbose=0)

        def gradient_of(rank: int) -> np.ndarray:
            data = np.random.default_rng(rank).normal(size=(8, 3)).astype(np.float32)
            return 2.0 / 8 * data.T @ (data @ np.ones((3, 1), np.float32))

        step = np.mean([gradient_of(k) for k in SET], axis=0) if r in SET else gradient_of(r)
        assert_close(model.layers[-1].kernel, 1.0 - 0.1 * step, f"Keras {family} model.fit over the set",
                     rtol=1e-4)


def tf1_optimizer_process_sets():
    r = bps.rank()
    for how in ("eager", "tf.function"):
        w = tf.Variable(tf.ones([4]))
        opt = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), process_set=evens,
                                       name=f"tf1ps.{how}")
        x = tf.constant(x_of(r))
        run_once(how, lambda opt=opt, w=w, x=x: opt.minimize(lambda: tf.reduce_sum(w * x), var_list=[w]))
        assert_close(w, 1.0 - expected_mean(r), f"TF1 optimizer over the set, {how}")


def adasum_ranks():
    """op=Adasum needs a power-of-two number of ranks: 3 are refused at the call; a set of 2 combines its two."""
    r, n = bps.rank(), bps.size()
    if n & (n - 1):  # 3 ranks (the default run); 4 (two machines of two) may combine
        expect_error(NotImplementedError, "power-of-two number of ranks", lambda: bps.DistributedGradientTape(
            tf.GradientTape(), op=bps.Adasum))
        expect_error(NotImplementedError, "power-of-two number of ranks", lambda: bps.DistributedOptimizer(
            keras.optimizers.SGD(0.1), op=bps.Adasum))
        expect_error(NotImplementedError, "power-of-two number of ranks", lambda: bps.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1), op=bps.Adasum))
    w = tf.Variable(tf.ones([4]))
    a, b = (x_of(k).astype(np.float64) for k in SET)
    combined = (1 - a @ b / (2 * a @ a)) * a + (1 - a @ b / (2 * b @ b)) * b
    want = combined if r in SET else x_of(r)
    for how, gradient in (("eager", tape_gradient(w, tf.constant(x_of(r)), process_set=evens, op=bps.Adasum)),
                          ("tf.function", tf.function(lambda t: tape_gradient(w, t, process_set=evens,
                                                                              op=bps.Adasum))(tf.constant(x_of(r))))):
        assert_close(gradient, want, f"tape Adasum over the set, {how}")


def broadcast_variables_process_sets():
    r = bps.rank()
    for how in ("eager", "tf.function"):
        v = tf.Variable(tf.fill([3], float(r)))
        i = tf.Variable(tf.fill([2], tf.constant(r, tf.int8)))
        def run(how=how, v=v, i=i):
            run_once(how, lambda: bps.broadcast_variables([v, i], root_rank=2, process_set=evens))

        if r in SET:
            run()
            assert_close(v, np.full([3], 2.0), f"broadcast_variables over the set, {how}")
            assert i.numpy().tolist() == [2, 2], i
        else:
            expect_error(ValueError, "is not in ProcessSet", run)
            assert_close(v, np.full([3], float(r)), "outside the set nothing changes")
    if r in SET:
        expect_error(ValueError, "root_rank 1 is not in", lambda: bps.broadcast_variables([v], 1, process_set=evens))
    bps.broadcast_variables([], root_rank=0, process_set=evens)  # nothing to send: no error, on rank 1 too


def wrapper_errors():
    unregistered = bps.ProcessSet([0, 1])
    w = tf.Variable(tf.ones([4]))
    with tf.GradientTape() as tape:
        pass
    expect_error(ValueError, "not registered", lambda: bps.DistributedGradientTape(tape, process_set=unregistered))
    expect_error(ValueError, "not registered", lambda: bps.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(1.0), process_set=unregistered))
    expect_error(ValueError, "drop process_set", lambda: bps.DistributedGradientTape(
        tape, process_set=evens, compression_params={"compressor": "topk", "k": 1}))
    expect_error(ValueError, "backward_passes_per_step", lambda: bps.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(1.0), backward_passes_per_step=0))
    del w
    # The job stays usable on every rank after the errors (rank 1's broadcast_variables refusal among them).
    total = bps.allreduce(tf.fill([2], float(bps.rank())), op=bps.Sum, name="after.errors")
    assert_close(total, np.full([2], float(sum(range(bps.size())))), "allreduce after the errors")
    bps.barrier()


def tf1_passes_reference(passes: int, steps: int, average: bool, lr: float = 0.5):
    """Each pass k of rank r has gradient x_r * (k + 1): the weights and returned gradients of every pass."""
    n, r = bps.size(), bps.rank()
    w = np.ones(4, np.float32)
    weights, gradients = [], []
    running = np.zeros(4, np.float32)
    for k in range(steps):
        running = running + x_of(r) * (k + 1)
        if (k + 1) % passes == 0:
            first = k + 1 - passes
            sums = [sum(x_of(q) * (j + 1) for j in range(first, k + 1)) for q in range(n)]
            reduced = np.mean(sums, axis=0) / (passes if average else 1)
            w = w - lr * reduced
            gradients.append(reduced)
            running = np.zeros(4, np.float32)
        else:
            gradients.append(running.copy())
        weights.append(w.copy())
    return weights, gradients


def tf1_step(opt, w: tf.Variable, step_count: tf.Variable):
    """One pass of Horovod's TF1 loop: compute_gradients, then apply_gradients; returns the pass's gradient."""
    def step(scale):
        pairs = opt.compute_gradients(lambda: tf.reduce_sum(w * x_of(bps.rank()) * scale), var_list=[w])
        opt.apply_gradients(pairs, global_step=step_count)
        return pairs[0][0]

    return step


def tf1_backward_passes():
    r, steps = bps.rank(), 4
    for average in (False, True):
        weights, gradients = tf1_passes_reference(2, steps, average)
        for how in ("eager", "tf.function"):
            w = tf.Variable(tf.ones([4]))
            step_count = tf.Variable(0, dtype=tf.int64)
            opt = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5),
                                           backward_passes_per_step=2, average_aggregated_gradients=average,
                                           name=f"tf1.passes.{average}.{how}")
            step = tf1_step(opt, w, step_count)
            run = step if how == "eager" else tf.function(step)
            for k in range(steps):
                gradient = run(tf.constant(float(k + 1)))
                what = f"TF1 backward passes (average={average}), {how}, pass {k + 1}"
                assert_close(gradient, gradients[k], f"{what}: gradient")
                assert_close(w, weights[k], f"{what}: weights")
                assert int(step_count.numpy()) == k + 1, (what, int(step_count.numpy()))
    # A TF1 graph, as Horovod's TF1 scripts run it: minimize() in a session.
    weights, _ = tf1_passes_reference(2, steps, False)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([4]))
        scale = tf.compat.v1.placeholder(tf.float32, [])
        global_step = tf.compat.v1.train.get_or_create_global_step()
        opt = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5),
                                       backward_passes_per_step=2, name="tf1.passes.graph")
        train = opt.minimize(tf.reduce_sum(w * x_of(r) * scale), var_list=[w], global_step=global_step)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for k in range(steps):
                session.run(train, {scale: float(k + 1)})
                assert_close(session.run(w), weights[k], f"TF1 graph backward passes, pass {k + 1}")
                assert session.run(global_step) == k + 1


def scale_factors():
    n, r = bps.size(), bps.rank()
    # IndexedSlices: every rank's values, each scaled before and after the gather.
    slices = tf.IndexedSlices(tf.fill([1, 2], float(r + 1)), tf.constant([r]), dense_shape=tf.constant([n, 2]))
    want = np.array([[k + 1.0] * 2 for k in range(n)], np.float32) * 0.5 * 3.0
    for how, run in (("eager", lambda s: bps.allreduce(s, op=bps.Sum, prescale_factor=0.5, postscale_factor=3.0,
                                                        name="slices.scaled")),
                     ("tf.function", tf.function(lambda s: bps.allreduce(
                         s, op=bps.Sum, prescale_factor=0.5, postscale_factor=3.0, name="slices.scaled.fn")))):
        got = run(slices)
        assert_close(tf.convert_to_tensor(got), want, f"IndexedSlices pre/postscale, {how}")
    averaged = bps.allreduce(slices, prescale_factor=2.0, name="slices.scaled.avg")
    assert_close(tf.convert_to_tensor(averaged), want / 1.5 * 2.0 / n, "IndexedSlices average, scaled")
    # grouped_allreduce: dense tensors scaled, over every rank and over the set.
    tensors = [tf.fill([3], float(r + 1)), tf.fill([2, 2], float(2 * r))]
    totals = [np.full([3], sum(k + 1.0 for k in range(n))), np.full([2, 2], sum(2.0 * k for k in range(n)))]
    grouped = tf.function(lambda a, b: bps.grouped_allreduce([a, b], op=bps.Sum, prescale_factor=2.0,
                                                             postscale_factor=0.25, name="grouped.scaled.fn"))
    for how, got in (("eager", bps.grouped_allreduce(tensors, op=bps.Sum, prescale_factor=2.0, postscale_factor=0.25,
                                                     name="grouped.scaled")),
                     ("tf.function", grouped(*tensors))):
        for g, total in zip(got, totals):
            assert_close(g, total * 0.5, f"grouped_allreduce pre/postscale, {how}")
    if r in SET:
        got = bps.grouped_allreduce(tensors, prescale_factor=3.0, postscale_factor=2.0, process_set=evens,
                                    name="grouped.scaled.set")
        assert_close(got[0], np.full([3], np.mean([k + 1.0 for k in SET]) * 6.0), "grouped pre/postscale, set")


def main():
    global evens
    bps.init()
    assert bps.size() in (3, 4), bps.size()  # 3 on one machine; 4: two machines of two (tests/matrix)
    evens = bps.add_process_set(SET)
    checks.run("DistributedGradientTape with a process set", tape_process_sets)
    checks.run("Keras DistributedOptimizer with a process set", keras_optimizer_process_sets)
    checks.run("TF1 DistributedOptimizer with a process set", tf1_optimizer_process_sets)
    checks.run("broadcast_variables with a process set", broadcast_variables_process_sets)
    checks.run("TF1 DistributedOptimizer with backward_passes_per_step=2", tf1_backward_passes)
    checks.run("prescale_factor and postscale_factor", scale_factors)
    checks.run("op=Adasum: a power-of-two number of ranks, over a process set", adasum_ranks)
    checks.run("errors, and the job usable after them", wrapper_errors)
    bps.remove_process_set(evens)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
