"""Worker script: byteps.tensorflow's ops, eagerly and inside tf.function, checked by every rank.

Run under bpslaunch (2 ranks; 4 in tests/matrix/test_training_layouts.py). Every tensor
derives from the rank, so each rank computes the exact expected result itself. Prints ``OK <check>`` per
check and ``ALL OK <n>`` at the end; the first failure exits 1. One script
covers many checks because every job pays TensorFlow's import once per rank.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from check_runner import Checks, assert_close, assert_equal, expect_error

import byteps.tensorflow as bps
from byteps.common.frontend.row_sparse import job_takes_row_sparse

DTYPES = [tf.float16, tf.float32, tf.float64, tf.bfloat16, tf.int32, tf.int64]
SHAPES = [(7,), (3, 4)]
BIG = 1 << 20  # float32 elements: 4 MB, several partitions
checks = Checks()


def value(shape, dtype, r):
    """Rank r's tensor: small integers (halves for floats), exact in every dtype and in the sums."""
    k = (np.arange(int(np.prod(shape))) % 17 - 8).reshape(shape)
    if dtype.is_floating:
        return tf.cast(tf.constant(k * 0.5 * (r + 1), tf.float64), dtype)
    return tf.constant((k * (r + 1) + r).astype(dtype.as_numpy_dtype))


def expected(shape, dtype, average):
    n = bps.size()
    wide = tf.float64 if dtype.is_floating else tf.int64
    total = sum(value(shape, wide, r) for r in range(n))
    if average:
        total = total / n if dtype.is_floating else total // n
    return tf.cast(total, dtype)


def dtypes_eager_and_in_function():
    r = bps.rank()

    @tf.function
    def in_graph(x, y):
        # three ops in one trace, named and unnamed
        return (bps.push_pull(x, average=True, name="fn.pp"), bps.allreduce(y, op=bps.Sum),
                bps.allreduce(x, name="fn.ar"))

    for dtype in DTYPES:
        for shape in SHAPES:
            tag = f"{dtype.name}.{len(shape)}d"
            x = value(shape, dtype, r)
            assert_equal(bps.push_pull(x, name=f"pp.{tag}"), expected(shape, dtype, True), f"push_pull {tag}")
            assert_equal(bps.push_pull(x, average=False, name=f"pps.{tag}"), expected(shape, dtype, False),
                         f"push_pull sum {tag}")
            assert_equal(bps.allreduce(x, op=bps.Sum, name=f"ar.{tag}"), expected(shape, dtype, False),
                         f"allreduce Sum {tag}")
            assert_equal(bps.allreduce(x, name=f"ara.{tag}"), expected(shape, dtype, True),
                         f"allreduce default average {tag}")
            avg, total, avg2 = in_graph(x, x)
            assert_equal(avg, expected(shape, dtype, True), f"tf.function push_pull {tag}")
            assert_equal(total, expected(shape, dtype, False), f"tf.function unnamed allreduce {tag}")
            assert_equal(avg2, expected(shape, dtype, True), f"tf.function allreduce {tag}")


def big_and_empty_tensors():
    r, n = bps.rank(), bps.size()
    x = tf.fill([BIG], float(r + 1))
    assert_equal(bps.allreduce(x, op=bps.Sum, name="big"), tf.fill([BIG], float(n * (n + 1) // 2)), "4 MB tensor")
    empty = tf.zeros([0, 3])
    assert bps.allreduce(empty, name="empty").shape == (0, 3)
    scalar = tf.constant(float(r + 1))
    assert_equal(bps.allreduce(scalar, op=bps.Sum, name="scalar"), tf.constant(float(n * (n + 1) // 2)), "scalar")


def default_names():
    r, n = bps.rank(), bps.size()
    for i in range(3):  # eagerly: allreduce.noname.<k> in order on every rank
        y = bps.allreduce(tf.fill([i + 1], float(r)), op=bps.Sum)
        assert_equal(y, tf.fill([i + 1], float(n * (n - 1) // 2)), f"unnamed allreduce #{i}")

    @tf.function
    def unnamed(x):
        return bps.allreduce(x * 2.0, op=bps.Sum), bps.broadcast(x, 0), bps.push_pull(x + 1.0)

    # Rank 1 traces once more (another shape first): graph names must not depend on trace counts.
    if r == 1:
        unnamed.get_concrete_function(tf.TensorSpec([5], tf.float32))
    a, b, c = unnamed(tf.fill([2], float(r + 1)))
    assert_equal(a, tf.fill([2], float(n * (n + 1))), "unnamed allreduce in tf.function")
    assert_equal(b, tf.fill([2], 1.0), "unnamed broadcast in tf.function")
    assert_equal(c, tf.fill([2], (n * (n + 1) / 2 + n) / n), "unnamed push_pull in tf.function")


def compression_and_scaling():
    r, n = bps.rank(), bps.size()
    total = float(n * (n + 1) // 2)
    x = tf.fill([6], float(r + 1))
    y = bps.allreduce(x, op=bps.Sum, name="fp16", compression=bps.Compression.fp16)
    assert_equal(y, tf.fill([6], total), "fp16 compression keeps float32")
    y = bps.push_pull(tf.cast(x, tf.float64), average=False, name="fp16.pp", compression=bps.Compression.fp16)
    assert_equal(y, tf.fill([6], tf.constant(total, tf.float64)), "fp16 compression of float64")
    y = bps.allreduce(x, op=bps.Sum, name="scaled", prescale_factor=2.0, postscale_factor=0.25)
    assert_equal(y, tf.fill([6], total * 0.5), "prescale_factor / postscale_factor")
    y = tf.function(lambda t: bps.allreduce(t, op=bps.Sum, name="scaled.fn", postscale_factor=2.0,
                                            compression=bps.Compression.fp16))(x)
    assert_equal(y, tf.fill([6], total * 2), "scaling and compression in tf.function")


def bf16_compression():
    """Compression.bf16 sends each rank's float32/float64 values as bfloat16: values exact in bfloat16 come
    back exact (sum and average); 257 is not (8 significant bits), so each rank sends 256."""
    r, n = bps.rank(), bps.size()
    base = np.array([0.5, -3.0, 96.0, 1.25, 257.0])

    def want(average, dtype):
        sent = [tf.cast(tf.cast(base * (k + 1), tf.bfloat16), tf.float64).numpy() for k in range(n)]
        total = tf.cast(tf.cast(sum(sent) / (n if average else 1), tf.bfloat16), dtype)
        assert np.all(total.numpy()[:4] == (base * n * (n + 1) / 2 / (n if average else 1))[:4])
        return total

    x = tf.constant(base * (r + 1), tf.float32)
    y = bps.allreduce(x, op=bps.Sum, name="bf16", compression=bps.Compression.bf16)
    assert_equal(y, want(False, tf.float32), "bf16 compression, Sum")
    assert float(y[4]) != 257.0 * n * (n + 1) / 2, y
    y = bps.allreduce(tf.cast(x, tf.float64), name="bf16.avg", compression=bps.Compression.bf16)
    assert_equal(y, want(True, tf.float64), "bf16 compression of float64, Average")
    fn = tf.function(lambda t: (bps.allreduce(t, op=bps.Sum, name="bf16.fn", compression=bps.Compression.bf16),
                                bps.push_pull(t, name="bf16.fn.pp", compression=bps.Compression.bf16)))
    total, mean = fn(x)
    assert_equal(total, want(False, tf.float32), "bf16 compression in tf.function, Sum")
    assert_equal(mean, want(True, tf.float32), "bf16 compression in tf.function, push_pull average")
    halves = tf.constant([1.0, -2.5], tf.float16) * (r + 1)   # 16-bit floats go as they are
    assert_equal(bps.allreduce(halves, op=bps.Sum, name="bf16.f16", compression=bps.Compression.bf16),
                 tf.constant([1.0, -2.5], tf.float16) * (n * (n + 1) / 2), "bf16 compression leaves float16")


def gradients_of_ops():
    r, n = bps.rank(), bps.size()
    total = n * (n + 1) / 2
    w = tf.Variable(tf.fill([4], float(r + 1)))

    def grads(fn):
        with tf.GradientTape() as tape:
            y = fn(w)
            loss = tf.reduce_sum(y * float(r + 1))  # upstream gradient r + 1 on rank r
        return tape.gradient(loss, w)

    graph_grads = tf.function(grads, reduce_retracing=False)

    def check(run, mode):
        assert_equal(run(lambda v: bps.allreduce(v, name=f"g.avg.{mode}")), tf.fill([4], total / n),
                     f"{mode}: gradient of allreduce (average)")
        assert_equal(run(lambda v: bps.push_pull(v, average=False, name=f"g.sum.{mode}")), tf.fill([4], total),
                     f"{mode}: gradient of push_pull (sum)")
        # Horovod: the broadcast's gradient is the averaged gradient on the root, zeros elsewhere.
        want = tf.fill([4], total / n if r == 0 else 0.0)
        assert_equal(run(lambda v: bps.broadcast(v, 0, name=f"g.bc.{mode}")), want, f"{mode}: gradient of broadcast")
        # allgather (Horovod): each rank's rows get the averaged gradient of those rows.
        got = run(lambda v: bps.allgather(tf.reshape(v, [2, 2]), name=f"g.ag.{mode}"))
        assert_equal(got, tf.fill([4], total / n), f"{mode}: gradient of allgather")
        # reducescatter (Horovod): every rank's upstream rows gathered, times size() for a Sum.
        owners = tf.concat([tf.fill([4 // n], float(k + 1)) for k in range(n)], axis=0)
        got = run(lambda v: bps.reducescatter(v, op=bps.Sum, name=f"g.rs.{mode}"))
        assert_equal(got, owners * n, f"{mode}: gradient of reducescatter (sum)")
        got = run(lambda v: bps.reducescatter(v, name=f"g.rs.avg.{mode}"))
        assert_equal(got, owners, f"{mode}: gradient of reducescatter (average)")

    check(grads, "eager")
    check(graph_grads, "tf.function")


def broadcasts():
    r = bps.rank()
    for root in range(bps.size()):
        for dtype in DTYPES + [tf.bool, tf.uint8, tf.int8, tf.int16, tf.uint32]:
            x = tf.cast(tf.constant([r + 1, 0, r * 3 + 2]), dtype)
            want = tf.cast(tf.constant([root + 1, 0, root * 3 + 2]), dtype)
            assert_equal(bps.broadcast(x, root, name=f"bc.{root}.{dtype.name}"), want, f"broadcast {dtype.name}")
        fn = tf.function(lambda t, root=root: bps.broadcast(t, root, name=f"bc.fn.{root}"))
        assert_equal(fn(tf.fill([3, 2], float(r))), tf.fill([3, 2], float(root)), "broadcast in tf.function")


def broadcast_variables_and_objects():
    r = bps.rank()
    variables = [tf.Variable(tf.fill([3], float(r + 7))), tf.Variable(tf.constant([r, r + 1], tf.int64)),
                 tf.Variable(tf.constant([r == 0, r == 1]))]
    assert bps.broadcast_variables(variables, root_rank=1) is None
    assert_equal(variables[0], tf.fill([3], 8.0), "float variable from rank 1")
    assert_equal(variables[1], tf.constant([1, 2], tf.int64), "int64 variable from rank 1")
    assert_equal(variables[2], tf.constant([False, True]), "bool variable from rank 1")
    for v in variables:
        v.assign(v + tf.cast(r, v.dtype) if v.dtype != tf.bool else v)

    @tf.function
    def broadcast_in_graph():
        bps.broadcast_variables(variables[:2], root_rank=0)

    broadcast_in_graph()
    assert_equal(variables[0], tf.fill([3], 8.0), "broadcast_variables in tf.function")
    assert_equal(variables[1], tf.constant([1, 2], tf.int64), "broadcast_variables in tf.function (int64)")
    obj = {"rank": r, "list": list(range(r + 3))}
    got = bps.broadcast_object(obj if r == 0 else None, root_rank=0, name="obj")
    assert got == {"rank": 0, "list": [0, 1, 2]}, got
    expect_error(RuntimeError, "TF1 graph", lambda: bps.broadcast_global_variables(0))


def allgather():
    r, n = bps.rank(), bps.size()
    x = tf.reshape(tf.range((r + 1) * 2, dtype=tf.int64) + 10 * r, [r + 1, 2])
    want = tf.concat([tf.reshape(tf.range((k + 1) * 2, dtype=tf.int64) + 10 * k, [k + 1, 2]) for k in range(n)], 0)
    assert_equal(bps.allgather(x, name="ag"), want, "allgather of uneven rows")
    fn = tf.function(lambda t: bps.allgather(t, name="ag.fn"))
    got = fn(tf.cast(x, tf.float32))
    assert_equal(got, tf.cast(want, tf.float32), "allgather in tf.function")
    assert got.shape.rank == 2
    empty = bps.allgather(tf.zeros([0, 2]) if r == 0 else tf.ones([1, 2]), name="ag.empty")
    assert_equal(empty, tf.ones([n - 1, 2]), "allgather with no rows on rank 0")


def embedding_gradient(ids, table):
    with tf.GradientTape() as tape:
        rows = tf.gather(table, ids)
        loss = tf.reduce_sum(rows * tf.cast(tf.reshape(ids, [-1, 1]) + 1, tf.float32))
    return tape, loss


def gradient_tape():
    r, n = bps.rank(), bps.size()
    w = tf.Variable(tf.fill([3], 2.0))
    table = tf.Variable(tf.ones([6, 2]))
    ids = tf.constant([r, r + 2, 5]) if r == 0 else tf.constant([r + 2, 5])
    all_ids = [tf.constant([k, k + 2, 5]) if k == 0 else tf.constant([k + 2, 5]) for k in range(n)]
    # IndexedSlices take the row-sparse push_pull in every layout of several processes (docs/sparse.md)
    row_sparse = job_takes_row_sparse(bps.Average, None)

    def dense_truth(op_average=True):
        total = np.zeros([6, 2], np.float32)
        for k_ids in all_ids:
            for i in k_ids.numpy():
                total[i] += i + 1
        return total / n if op_average else total

    def step(wrap_kwargs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * float(r + 1))
        tape = bps.DistributedGradientTape(tape, **wrap_kwargs)
        return tape.gradient(loss, [w])[0]

    avg = n * (n + 1) / 2 / n
    assert_equal(step({}), tf.fill([3], avg), "tape average (eager)")
    assert_equal(tf.function(lambda: step({}))(), tf.fill([3], avg), "tape average (tf.function)")
    fn = tf.function(lambda: step({"op": bps.Sum, "compression": bps.Compression.fp16}))
    assert_equal(fn(), tf.fill([3], avg * n), "tape Sum + fp16 (tf.function)")
    assert_equal(step({"gradient_predivide_factor": 2.0}), tf.fill([3], avg), "tape gradient_predivide_factor")

    # a tape wrapped before recording, and a nested structure of sources
    with bps.DistributedGradientTape(tf.GradientTape()) as tape:
        loss = tf.reduce_sum(w * float(r + 1))
    got = tape.gradient(loss, {"w": w, "unused": table})
    assert got["unused"] is None and isinstance(got, dict)
    assert_equal(got["w"], tf.fill([3], avg), "tape wrapped before recording, dict of sources")

    for sparse_as_dense in (False, True):
        for mode in ("eager", "tf.function"):
            def sparse_step(sparse_as_dense=sparse_as_dense):
                tape, loss = embedding_gradient(ids, table)
                tape = bps.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
                grad = tape.gradient(loss, [table])[0]
                return grad if not isinstance(grad, tf.IndexedSlices) else (grad.values, grad.indices)

            got = sparse_step() if mode == "eager" else tf.function(sparse_step)()
            what = f"embedding gradient, sparse_as_dense={sparse_as_dense}, {mode}"
            if sparse_as_dense:
                assert isinstance(got, tf.Tensor), what
                dense = got
            else:
                values, indices = got
                if row_sparse:  # through the servers: the union of the ids, ascending, rows summed by id
                    union = sorted({int(i) for k_ids in all_ids for i in k_ids.numpy()})
                    assert indices.numpy().tolist() == union, (what, indices)
                else:  # gathered: every rank's ids
                    assert indices.shape[0] == sum(len(k) for k in all_ids), what
                dense = tf.math.unsorted_segment_sum(values, indices, 6)
            assert_equal(dense, dense_truth(), what)

    # a dense gradient before an IndexedSlices in one call: a (fused) reduce, then a gather
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * float(r + 1)) + embedding_gradient(ids, table)[1]
    dense_grad, sparse_grad = bps.DistributedGradientTape(tape).gradient(loss, [w, table])
    assert isinstance(sparse_grad, tf.IndexedSlices), type(sparse_grad)
    assert_equal(dense_grad, tf.fill([3], avg), "dense gradient before IndexedSlices")
    assert_equal(tf.math.unsorted_segment_sum(sparse_grad.values, sparse_grad.indices, 6), dense_truth(),
                 "IndexedSlices after a dense gradient")

    # the reduced IndexedSlices applied by a Keras optimizer: same update as the dense average
    import keras

    for sparse_as_dense in (False, True):
        var = tf.Variable(tf.ones([6, 2]))
        optimizer = keras.optimizers.SGD(1.0)
        tape, loss = embedding_gradient(ids, var)
        grad = bps.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense).gradient(loss, [var])[0]
        optimizer.apply_gradients([(grad, var)])
        assert_close(var, 1.0 - dense_truth(), f"SGD update from sparse_as_dense={sparse_as_dense}")
    slices = tf.IndexedSlices(tf.fill([2, 2], float(r + 1)), tf.constant([r, 3]), dense_shape=tf.constant([4, 2]))
    summed = bps.allreduce(slices, op=bps.Sum, name="slices")
    assert isinstance(summed, tf.IndexedSlices)
    want = np.zeros([4, 2], np.float32)
    for k in range(n):
        want[k] += k + 1
        want[3] += k + 1
    assert_equal(tf.math.unsorted_segment_sum(summed.values, summed.indices, 4), want, "allreduce of IndexedSlices")


def tf1_optimizer():
    r, n = bps.rank(), bps.size()
    v = tf.Variable(tf.fill([2], 1.0))
    optimizer = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
    optimizer.minimize(lambda: tf.reduce_sum(v * float(r + 1)), var_list=[v])
    assert_equal(v, tf.fill([2], 1.0 - 0.5 * (n + 1) / 2), "TF1 GradientDescentOptimizer.minimize")


def errors_and_mismatches():
    r = bps.rank()
    # narrow integers are summed in a wider type and cast back, as Horovod returns them
    y = bps.allreduce(tf.ones([3], tf.uint8), op=bps.Sum, name="u8")
    assert y.dtype == tf.uint8, y.dtype
    assert_equal(y, tf.fill([3], tf.cast(bps.size(), tf.uint8)), "uint8 allreduce")
    message = expect_error(ValueError, "unsupported dtype complex64", lambda: bps.allreduce(
        tf.ones([3], tf.complex64), name="c64.eager"))
    assert "float32" in message and "bfloat16" in message, message
    fn = tf.function(lambda t: bps.allreduce(t, name="c64"))
    expect_error(ValueError, "unsupported dtype complex64", lambda: fn(tf.ones([2], tf.complex64)))
    expect_error(ValueError, "unsupported dtype string", lambda: bps.broadcast(tf.constant(["a"]), 0))
    # Adasum (Horovod's): (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b for two ranks, and for more (a power of
    # two) its binary tree: ranks 0 and 1, 2 and 3, ... first, then those pairwise; eagerly and in a graph
    mine = [np.array([1.0, 2.0, -3.0, 0.5]) * (k + 1) + np.array([0, 1.0, 0, 0]) * k for k in range(bps.size())]
    level = mine
    while len(level) > 1:
        level = [(1 - a @ b / (2 * a @ a)) * a + (1 - a @ b / (2 * b @ b)) * b for a, b in zip(level[::2], level[1::2])]
    want = level[0]
    x = tf.constant(mine[r], tf.float32)
    assert_close(bps.allreduce(x, op=bps.Adasum, name="adasum"), want, "Adasum")
    assert_close(tf.function(lambda t: bps.allreduce(t, op=bps.Adasum, name="adasum.fn"))(x), want, "Adasum graph")
    expect_error(NotImplementedError, "floating-point", lambda: bps.allreduce(tf.ones(3, tf.int32), op=bps.Adasum))
    # DistributedGradientTape(op=Adasum) combines the ranks' gradients the same way (scripts/adasum_checks.py
    # checks the wrappers in depth)
    w = tf.Variable(tf.ones([4]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * x)
    assert_close(bps.DistributedGradientTape(tape, op=bps.Adasum).gradient(loss, [w])[0], want, "tape Adasum")
    expect_error(ValueError, "supersedes", lambda: bps.allreduce(tf.ones(3), average=True, op=bps.Sum))
    expect_error(ValueError, "root_rank", lambda: bps.broadcast(tf.ones(2), root_rank=bps.size()))
    expect_error(ValueError, "must be a ProcessSet", lambda: bps.allreduce(tf.ones(2), process_set="evens"))
    # ranks disagree on a shape (same bytes): every rank gets a PushPullError naming both descriptions
    shape = [4] if r == 0 else [2, 2]
    message = expect_error(bps.PushPullError, "shape", lambda: bps.allreduce(tf.ones(shape), name="mismatch"))
    print(f"MISMATCH eager: {message}", flush=True)
    dtype = tf.float32 if r == 0 else tf.int32
    fn = tf.function(lambda t: bps.allreduce(t, name="mismatch.fn"))
    # inside a graph the error keeps its class (byteps.tensorflow.graph_errors), as Horovod's
    message = expect_error(tf.errors.FailedPreconditionError, "mismatch.fn", lambda: fn(tf.ones([3], dtype)))
    print(f"MISMATCH tf.function: {' '.join(message.splitlines())}", flush=True)
    # the refused calls and the failed rounds leave the job usable: collectives, eager and in a tf.function,
    # and a barrier work on every rank. (Not under the failed names: each rank's name keeps the layout it
    # first declared, so after a shape or dtype mismatch a retry of that name no longer pairs up.)
    y = bps.allreduce(tf.fill([3], float(r + 1)), op=bps.Sum, name="after.mismatch")
    assert_equal(y, tf.fill([3], float(bps.size() * (bps.size() + 1) // 2)), "allreduce after the errors")
    fn = tf.function(lambda t: bps.allreduce(t, name="after.mismatch.fn"))
    assert_equal(fn(tf.fill([3], float(r + 1))), tf.fill([3], (bps.size() + 1) / 2), "tf.function after the errors")
    bps.barrier()


def process_info():
    assert bps.is_initialized()
    assert 0 <= bps.local_rank() < bps.local_size() <= bps.size()
    print(f"INFO rank={bps.rank()} size={bps.size()} local_rank={bps.local_rank()} "
          f"local_size={bps.local_size()}", flush=True)
    bps.barrier()


def join() -> None:
    """hvd.join() at the end, after row-sparse push_pulls (the tape's IndexedSlices) in every layout."""
    bps.join()


def main():
    tf.config.threading.set_intra_op_parallelism_threads(1)
    bps.init()
    checks.run("process info", process_info)
    checks.run("dtypes x shapes, eager and tf.function", dtypes_eager_and_in_function)
    checks.run("big and empty tensors", big_and_empty_tensors)
    checks.run("default names", default_names)
    checks.run("compression and scaling", compression_and_scaling)
    checks.run("Compression.bf16, eager and in tf.function", bf16_compression)
    checks.run("gradients of ops", gradients_of_ops)
    checks.run("broadcasts", broadcasts)
    checks.run("broadcast_variables and broadcast_object", broadcast_variables_and_objects)
    checks.run("allgather", allgather)
    checks.run("DistributedGradientTape, dense and IndexedSlices", gradient_tape)
    checks.run("TF1 optimizer", tf1_optimizer)
    checks.run("errors and mismatches", errors_and_mismatches)
    checks.run("join", join)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
