"""Worker script (BYTEPS_ENABLE_ASYNC=1, 2 workers, 1 server): what asynchronous training refuses, and how.

Compression in any form (compression_params on DistributedTrainer or
DistributedOptimizer, Horovod's compression=Compression.fp16) is a
ValueError naming BYTEPS_ENABLE_ASYNC, raised before the optimizer is
touched; float16 weights with multi_precision are a NotImplementedError at
the first step, before any exchange. Each refusal prints its message.
"""

from __future__ import annotations

import mxnet as mx
from check_runner import Checks, expect_error
from mxnet import gluon

import byteps.mxnet as bps

ONEBIT = {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov"}


def dense(dtype: str = "float32") -> gluon.nn.Dense:
    net = gluon.nn.Dense(2, in_units=4)
    net.initialize()
    net.cast(dtype)
    return net


def refused(kind, call) -> None:
    message = expect_error(kind, "BYTEPS_ENABLE_ASYNC", call)
    print(f"refused: {message}", flush=True)


def main() -> None:
    bps.init()
    checks = Checks()
    checks.run("trainer compression_params", lambda: refused(ValueError, lambda: bps.DistributedTrainer(
        dense().collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9}, compression_params=ONEBIT)))
    checks.run("trainer fp16 compression_params", lambda: refused(ValueError, lambda: bps.DistributedTrainer(
        dense().collect_params(), "sgd", {"learning_rate": 0.1}, compression_params={"fp16": True})))
    checks.run("trainer Compression.fp16", lambda: refused(ValueError, lambda: bps.DistributedTrainer(
        dense().collect_params(), "sgd", {"learning_rate": 0.1}, compression=bps.Compression.fp16)))

    def optimizer_compression() -> None:
        sgd = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9)
        refused(ValueError, lambda: bps.DistributedOptimizer(sgd, compression_params=ONEBIT))
        assert sgd.momentum == 0.9, "the refused compressor took the optimizer's momentum"

    checks.run("optimizer compression_params", optimizer_compression)

    def master_weights() -> None:
        net = dense("float16")
        trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "multi_precision": True})
        # Refused before gluon looks at the gradients (MXNet's CPU float16 Dense cannot make them).
        refused(NotImplementedError, lambda: trainer.step(3))

    checks.run("float16 with multi_precision", master_weights)
    mx.nd.waitall()
    checks.done()
    bps.shutdown()


if __name__ == "__main__":
    main()
