"""Worker script: Horovod's collectives in a TF1 graph (eager execution disabled, ``tf.compat.v1.Session``):
Min/Max/Product, Adasum, allgather, broadcast, alltoall, reducescatter, grouped allreduce, fp16/bf16
compression, process sets, broadcast_variables, the timeline and join, checked by every rank against
numpy. (The TF1 ``DistributedOptimizer`` in a graph is checked by test_wrappers.py.)

Run under bpslaunch with 2 ranks. Prints ``OK <check>`` per check and ``ALL OK <n>``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

from check_runner import Checks, assert_close, assert_equal  # noqa: E402

import byteps.tensorflow as bps  # noqa: E402

checks = Checks()
v1 = tf.compat.v1


def run(fetches):
    with v1.Session() as session:
        session.run(v1.global_variables_initializer())
        return session.run(fetches)


def reductions():
    n, r = bps.size(), bps.rank()
    x = tf.constant([float(r), -float(r), 2.0])
    mine = np.array([1.0, 2.0, -3.0, 0.5]) * (r + 1) + np.array([0, 1.0, 0, 0]) * r
    got = run({
        "min": bps.allreduce(x, op=bps.Min, name="g.min"),
        "max": bps.allreduce(x, op=bps.Max, name="g.max"),
        "product": bps.allreduce(x + 1, op=bps.Product, name="g.prod"),
        "adasum": bps.allreduce(tf.constant(mine), op=bps.Adasum, name="g.adasum"),
        "sum": bps.allreduce(tf.fill([3], float(r + 1)), op=bps.Sum, name="g.sum"),
        "average": bps.allreduce(tf.fill([3], float(r + 1)), name="g.avg"),
        "fp16": bps.allreduce(tf.fill([5], float(r + 1)), op=bps.Sum, name="g.fp16",
                              compression=bps.Compression.fp16),
        "bf16": bps.allreduce(tf.fill([5], float(r + 1)), op=bps.Sum, name="g.bf16",
                              compression=bps.Compression.bf16),
        "grouped": bps.grouped_allreduce([tf.ones(2), tf.fill([2, 2], float(r))], op=bps.Sum, name="g.group"),
    })
    ranks = np.arange(n, dtype=np.float64)
    assert_equal(got["min"], np.array([0.0, -(n - 1.0), 2.0], np.float32), "Min")
    assert_equal(got["max"], np.array([n - 1.0, 0.0, 2.0], np.float32), "Max")
    assert_equal(got["product"], np.array([np.prod(ranks + 1), np.prod(1 - ranks), 3.0 ** n], np.float32), "Product")
    if n == 2:  # Horovod's Adasum of two vectors
        a = np.array([1.0, 2.0, -3.0, 0.5])
        b = a * 2 + np.array([0, 1.0, 0, 0])
        want = (1 - a @ b / (2 * a @ a)) * a + (1 - a @ b / (2 * b @ b)) * b
        assert_close(got["adasum"], want, "Adasum")
    total = float(sum(range(1, n + 1)))
    assert_equal(got["sum"], np.full(3, total, np.float32), "Sum")
    assert_equal(got["average"], np.full(3, total / n, np.float32), "Average")
    assert_equal(got["fp16"], np.full(5, total, np.float32), "Compression.fp16")
    assert_equal(got["bf16"], np.full(5, total, np.float32), "Compression.bf16")
    assert_equal(got["grouped"][0], np.full(2, float(n), np.float32), "grouped allreduce")
    assert_equal(got["grouped"][1], np.full((2, 2), float(sum(range(n))), np.float32), "grouped allreduce")


def gathers_and_scatters():
    n, r = bps.size(), bps.rank()
    rows = 2 * n + 1
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    send = tf.concat([tf.fill([k + 1, 2], float(10 * r + k)) for k in range(n)], axis=0)
    received, splits = bps.alltoall(send, splits=[k + 1 for k in range(n)], name="g.a2a")
    got = run({
        "allgather": bps.allgather(tf.fill([r + 1, 2], r + 1), name="g.ag"),
        "broadcast": bps.broadcast(tf.fill([3], float(r)), root_rank=n - 1, name="g.bc"),
        "alltoall": received, "splits": splits,
        "reducescatter": bps.reducescatter(tf.reshape(tf.range(rows * 3) + r, [rows, 3]), op=bps.Sum,
                                           name="g.rs"),
    })
    want = np.concatenate([np.full((k + 1, 2), k + 1, np.int32) for k in range(n)])
    assert_equal(got["allgather"], want, "allgather of uneven rows")
    assert_equal(got["broadcast"], np.full(3, float(n - 1), np.float32), "broadcast")
    assert_equal(got["splits"], np.full(n, r + 1, np.int32), "alltoall's received splits")
    assert_equal(got["alltoall"], np.concatenate([np.full((r + 1, 2), float(10 * k + r), np.float32)
                                                  for k in range(n)]), "alltoall")
    total = sum(np.arange(rows * 3).reshape(rows, 3) + k for k in range(n))
    first = sum(counts[:r])
    assert_equal(got["reducescatter"], total[first:first + counts[r]].astype(np.int32), "reducescatter")


def process_sets():
    n, r = bps.size(), bps.rank()
    sets = [bps.add_process_set([k]) for k in range(n)]   # every rank adds the same sets in the same order
    everyone = bps.global_process_set
    mine = sets[r]
    got = run({
        "alone": bps.allreduce(tf.fill([2], float(r)), op=bps.Sum, name="g.ps", process_set=mine),
        "all": bps.allreduce(tf.fill([2], float(r + 1)), op=bps.Sum, name="g.ps.all", process_set=everyone),
        "gather": bps.allgather(tf.fill([1], r), name="g.ps.ag", process_set=everyone),
    })
    assert_equal(got["alone"], np.full(2, float(r), np.float32), "a set of one")
    assert_equal(got["all"], np.full(2, float(sum(range(1, n + 1))), np.float32), "a set of every rank")
    assert_equal(got["gather"], np.arange(n, dtype=np.int32), "a set's allgather")
    for process_set in sets:
        assert bps.remove_process_set(process_set)
    bps.barrier()


def broadcast_variables():
    n, r = bps.size(), bps.rank()
    weights = v1.get_variable("weights", initializer=tf.fill([2, 3], float(r + 1)))
    bias = v1.get_variable("bias", initializer=tf.fill([3], -float(r)))
    with v1.Session() as session:
        session.run(v1.global_variables_initializer())
        session.run(bps.broadcast_variables([weights, bias], root_rank=n - 1))
        got_weights, got_bias = session.run([weights, bias])
    assert_equal(got_weights, np.full((2, 3), float(n), np.float32), "weights from the last rank")
    assert_equal(got_bias, np.full(3, -float(n - 1), np.float32), "bias from the last rank")


def timeline():
    """start_timeline .. stop_timeline around session runs: rank 0's trace names the graph's allreduce."""
    path = os.path.join(os.environ["BYTEPS_TEST_TMP"], "tf1_timeline.json")
    traced = bps.allreduce(tf.ones([1000]), name="g.timeline")
    with v1.Session() as session:
        bps.start_timeline(path)
        for _ in range(2):
            session.run(traced)
        bps.stop_timeline()
    bps.barrier()
    if bps.rank() != 0:
        return
    with open(path) as handle:
        tensors = [e["name"] for e in json.load(handle)["traceEvents"] if e["ph"] == "X" and e["cat"] == "tensor"]
    assert sum("g.timeline" in name for name in tensors) == 2, tensors


def uneven_join():
    """Rank r runs 2 + r session steps; a joined rank counts as zeros. join() is an op here, run twice."""
    r, n = bps.rank(), bps.size()
    summed = bps.allreduce(tf.fill([3], float(r + 1)), op=bps.Sum, name="g.uneven")
    joined = bps.join()
    with v1.Session() as session:
        for _ in range(2):
            for step in range(2 + r):
                want = float(sum(k + 1 for k in range(n) if 2 + k > step))
                assert_equal(session.run(summed), np.full(3, want, np.float32), f"step {step}")
            assert session.run(joined) == n - 1


def main():
    bps.init()
    for name, check in [("Min/Max/Product, Adasum, Sum/Average, fp16/bf16, grouped", reductions),
                        ("allgather, broadcast, alltoall, reducescatter", gathers_and_scatters),
                        ("process sets", process_sets), ("broadcast_variables", broadcast_variables),
                        ("timeline", timeline), ("join with uneven data", uneven_join)]:
        with tf.Graph().as_default():
            checks.run(name, check)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
