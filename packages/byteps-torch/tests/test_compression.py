"""BytePS's gradient compression through a real job: 2 workers, 1 server, DistributedOptimizer(compression_params).

Each rank records its local gradients and the gradients the compressed
round left (scripts/compression_training.py); the test replays the local
gradients through the numpy reference of byteps.testkit.compression_reference
(worker momentum and error feedback and codec, server sum, server error
feedback and codec) and requires the same averaged gradients on both ranks,
every step, to float32 tolerance. Two weights (800 bytes each) are
compressed, each alone inside one fused bucket; the bias and a gain (20
bytes each) are below BYTEPS_MIN_COMPRESS_BYTES=64 and go uncompressed,
fused into another bucket, getting their Nesterov momentum after the pull.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from job_checks import SCRIPTS

from byteps.testkit import free_port, launch_job, report
from byteps.testkit.compression_reference import ReferenceJob, uncompressed_rounds

STEPS = 6
CASES = {
    "onebit-scaling-ef-nesterov": ({"compressor": "onebit", "scaling": True, "ef": "vanilla",
                                    "momentum": "nesterov"}, 0.9),
    "onebit-signs": ({"compressor": "onebit"}, 0.0),
    "topk-fraction-ef": ({"compressor": "topk", "k": 0.1, "ef": "vanilla"}, 0.0),
    "randomk-seeded-ef": ({"compressor": "randomk", "k": 20, "seed": 7, "ef": "vanilla"}, 0.0),
    "dithering-natural-l2": ({"compressor": "dithering", "k": 4, "partition": "natural", "normalize": "l2",
                              "seed": 3}, 0.0),
    "dithering-linear-max-ef-nesterov": ({"compressor": "dithering", "k": 8, "seed": 11, "ef": "vanilla",
                                          "momentum": "nesterov"}, 0.5),
}


def _run(tmp_path, params, mu, *extra, layout=("--workers", "2", "--servers", "1"), ranks=2, env=None):
    result = launch_job(list(layout), os.path.join(SCRIPTS, "compression_training.py"),
                        [json.dumps(params), str(tmp_path), str(STEPS), str(mu), *extra],
                        env={"BYTEPS_MIN_COMPRESS_BYTES": "64", "MASTER_PORT": str(free_port()), **(env or {})},
                        timeout=120)
    assert result.returncode == 0, report(result)
    return [np.load(tmp_path / f"rank{rank}.npz") for rank in range(ranks)]


def _check_weight(records, reference, case, per_machine=1, names=("weight", "weight2")):
    """Each compressed weight's averaged gradient, every step and rank, against the reference job's (each
    weight has its own codec, generator and error there, as it has inside a fused bucket here)."""
    for name in names:
        for step in range(STEPS):
            lr = float(records[0]["lr"][step])
            machines = [records[m:m + per_machine] for m in range(0, len(records), per_machine)]
            local_sums = []
            for machine in machines:  # the local root sums its machine's gradients, then compresses that
                total = machine[0][f"local_{name}"][step]
                for other in machine[1:]:
                    total = (total + other[f"local_{name}"][step]).astype(np.float32)
                local_sums.append(total)
            expected = reference.round(name, local_sums, lr)
            for rank, record in enumerate(records):
                np.testing.assert_allclose(record[f"synced_{name}"][step], expected, rtol=1e-6, atol=1e-7,
                                           err_msg=f"{case}: {name}, step {step}, rank {rank}")
        # Compression did something: the weight's averaged gradient is not the plain average.
        plain = (records[0][f"local_{name}"][-1] + records[1][f"local_{name}"][-1]) / 2
        assert not np.allclose(records[0][f"synced_{name}"][-1], plain, atol=1e-6)


@pytest.mark.parametrize("case", list(CASES))
def test_two_workers_match_the_reference_algorithm(case, tmp_path):
    params, mu = CASES[case]
    records = _run(tmp_path, params, mu)
    _check_all(records, params, mu, case)
    for rank, record in enumerate(records):  # two buckets: the compressed weights, the small ones
        assert record["fused"].tolist() == [["gain", "linear.bias"], ["linear.weight", "linear2.weight"]], \
            f"rank {rank}: {record['fused']}"


def test_a_compression_thread_pool_gives_the_same_rounds(tmp_path):
    """BYTEPS_THREADPOOL_SIZE=2, fusion off: both weights' codecs run at once on the pool, same numbers."""
    case = "dithering-linear-max-ef-nesterov"
    params, mu = CASES[case]
    records = _run(tmp_path, params, mu, env={"BYTEPS_THREADPOOL_SIZE": "2", "BYTEPS_FUSION_THRESHOLD": "0"})
    _check_all(records, params, mu, f"{case}, thread pool")
    assert all("fused" not in record.files for record in records)  # no bucket: the script saves no list
    assert all(record["pool_threads"][0] >= 1 for record in records)  # the codecs ran on the pool


def _check_all(records, params, mu, case):
    """The compressed weights against the reference job, the small tensors against plain averages."""
    _check_weight(records, ReferenceJob(params, workers=2, momentum=mu), case)
    for name in ("bias", "gain"):
        expected = uncompressed_rounds([r[f"local_{name}"] for r in records], mu)
        for step in range(STEPS):
            for rank, record in enumerate(records):
                np.testing.assert_allclose(record[f"synced_{name}"][step], expected[step], rtol=1e-6, atol=1e-7,
                                           err_msg=f"{case}: {name}, step {step}, rank {rank}")


def test_two_machines_of_two_processes_compress_their_local_sums(tmp_path):
    params = {"compressor": "onebit", "scaling": True, "ef": "vanilla"}
    records = _run(tmp_path, params, 0.0, layout=("-np", "2", "--workers", "2", "--servers", "1"), ranks=4)
    _check_weight(records, ReferenceJob(params, workers=2, size=4), "local aggregation onebit", per_machine=2)


def test_native_ddp_with_the_byteps_hook_compresses_its_bucket(tmp_path):
    params = {"compressor": "topk", "k": 0.1, "ef": "vanilla"}
    records = _run(tmp_path, params, 0.0, "hook")
    _check_weight(records, ReferenceJob(params, workers=2), "ddp hook topk", names=("weight",))


@pytest.mark.parametrize("params, message", [
    ({"compressor": "onebit", "k": 3}, "'k'] does not apply"),
    ({"compressor": "onebit", "momentum": "nesterov"}, "optimizer's momentum, which is 0"),
])
def test_bad_compression_params_fail_at_the_call(params, message):
    import torch

    import byteps.torch as bps

    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match=re.escape(message)):
        bps.DistributedOptimizer(optimizer, compression_params=params)


@pytest.fixture
def one_process(monkeypatch):
    from byteps.testkit import one_process_adapter

    with one_process_adapter(monkeypatch, "byteps.torch") as adapter:
        yield adapter


@pytest.mark.parametrize("params, momentum, warns", [
    ({"compressor": "onebit", "scaling": True, "ef": "vanilla"}, 0.9, True),
    ({"compressor": "randomk", "k": 0.1, "ef": "vanilla"}, 0.5, True),
    ({"compressor": "onebit", "scaling": True, "ef": "vanilla", "momentum": "nesterov"}, 0.9, False),
    ({"compressor": "onebit", "scaling": True}, 0.9, False),
    ({"compressor": "randomk", "k": 0.1, "ef": "vanilla"}, 0.0, False),
])
def test_error_feedback_with_the_optimizers_momentum_warns_at_the_call(one_process, params, momentum, warns):
    import warnings

    import torch

    from byteps.common.compression import FeedbackMomentumWarning

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        one_process.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression_params=params)
    ours = [w for w in caught if issubclass(w.category, FeedbackMomentumWarning)]
    assert len(ours) == (1 if warns else 0), [str(w.message) for w in caught]
    if warns:
        assert ours[0].filename == __file__ and "nesterov" in str(ours[0].message)
