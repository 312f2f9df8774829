"""Backup workers in torch training (docs/async.md): a slow worker skips the rounds that closed without it.

Real jobs of 3 worker machines and 1 server under bpslaunch:
scripts/backup_training.py trains through DistributedOptimizer, the last
machine sleeping in every batch it computes. Checked against numpy: every
round's average is the mean of the gradients of the ranks of two machines
that computed the round (b = 1 of 3), every rank stepped with the same
averages, and the parameters every rank ends with are torch's momentum SGD
from the common start over those averages.
"""

import itertools
import json
import os
import pickle
import re

import numpy as np

from byteps.testkit import launch_job

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "backup_training.py")
STEPS, SLEEP_S = 16, 0.25
LR, MOMENTUM = 0.1, 0.9  # the script's


def results(tmp_path, env, layout=("--workers", "3", "--servers", "1")):
    result = launch_job(list(layout), SCRIPT, [str(STEPS), str(SLEEP_S), str(tmp_path)], env=env, timeout=120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    found = [json.loads(line) for line in re.findall(r"RESULT (\{.*\})", result.stdout)]
    return {r["rank"]: r for r in found}


def recorded(tmp_path, ranks):
    out = []
    for rank in range(ranks):
        with open(tmp_path / f"rank{rank}.pkl", "rb") as saved:
            out.append(pickle.load(saved))
    return out


def momentum_sgd(initial, averages):
    """torch's SGD (momentum, no dampening, wd 0) over the averaged gradients, in float64."""
    weights = {name: value.astype(np.float64) for name, value in initial.items()}
    buffers = {name: np.zeros_like(value) for name, value in weights.items()}
    for average in averages:
        for name in weights:
            buffers[name] = MOMENTUM * buffers[name] + average[name].astype(np.float64)
            weights[name] = weights[name] - LR * buffers[name]
    return weights


def made_by_two_machines(average, machines):
    """Whether ``average`` is the mean of the gradients of every rank of two of ``machines`` (lists of the
    gradients of each machine's ranks that computed the round)."""
    for first, second in itertools.combinations([m for m in machines if m], 2):
        gradients = first + second
        if all(np.allclose(average[name], sum(g[name] for g in gradients) / len(gradients), rtol=1e-5, atol=1e-7)
               for name in average):
            return True
    return False


def check_rounds(ranks, backup):
    """Every rank stepped with the same averages, each the mean of the machines that made the round, and ended
    with numpy's momentum SGD over them from the common start."""
    local_size = ranks[0]["local_size"]
    for rank in ranks:
        for name, value in rank["initial"].items():
            np.testing.assert_array_equal(value, ranks[0]["initial"][name], err_msg=name)
    for step in range(STEPS):
        applied = ranks[0]["applied"][step]
        for rank in ranks[1:]:  # the same averages, the slow machine's pulled without a push when it skipped
            for name, value in rank["applied"][step].items():
                np.testing.assert_array_equal(value, applied[name], err_msg=f"step {step} {name}")
        machines = [[rank["local"][step] for rank in ranks[m:m + local_size] if rank["computed"][step]]
                    for m in range(0, len(ranks), local_size)]
        if backup:
            assert made_by_two_machines(applied, machines), f"step {step}: not the mean of two machines' gradients"
        else:
            gradients = [g for machine in machines for g in machine]
            assert len(gradients) == len(ranks)
            for name, value in applied.items():
                np.testing.assert_allclose(value, sum(g[name] for g in gradients) / len(gradients), rtol=1e-5,
                                           atol=1e-7, err_msg=f"step {step} {name}")
    expected = momentum_sgd(ranks[0]["initial"], ranks[0]["applied"])
    for rank in ranks:
        for name, value in rank["final"].items():
            np.testing.assert_array_equal(value, ranks[0]["final"][name], err_msg=name)
            np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_slow_worker_skips_closed_rounds_and_every_replica_holds_the_rounds_averages(tmp_path):
    ranks = results(tmp_path, {"BYTEPS_BACKUP_WORKERS": "1"})
    assert len(ranks) == 3
    assert ranks[0]["parameters"] == ranks[1]["parameters"] == ranks[2]["parameters"], ranks
    assert ranks[0]["computed"] == ranks[1]["computed"] == STEPS
    slow = ranks[2]
    # It computed only the rounds it could still join, so it did not take STEPS x SLEEP_S = 4 s.
    assert 1 <= slow["computed"] <= STEPS // 2, slow
    assert slow["seconds"] < 0.6 * STEPS * SLEEP_S, slow
    check_rounds(recorded(tmp_path, 3), backup=True)


def test_without_backup_workers_nothing_is_skipped(tmp_path):
    ranks = results(tmp_path, {})
    assert all(r["computed"] == STEPS for r in ranks.values()), ranks
    assert ranks[0]["parameters"] == ranks[2]["parameters"]
    assert ranks[2]["seconds"] >= STEPS * SLEEP_S
    check_rounds(recorded(tmp_path, 3), backup=False)  # every round the mean of all three


def test_with_two_processes_per_machine_the_slow_machine_skips_together(tmp_path):
    """The machine is what is late: its local root's push is the machine's, and every local rank learns from
    the root's answers how far behind the machine is, so both ranks skip the same rounds."""
    ranks = results(tmp_path, {"BYTEPS_BACKUP_WORKERS": "1"}, ("-np", "2", "--workers", "3", "--servers", "1"))
    assert len(ranks) == 6
    assert all(r["parameters"] == ranks[0]["parameters"] for r in ranks.values()), ranks
    assert all(ranks[r]["computed"] == STEPS for r in range(4))
    assert ranks[4]["computed"] == ranks[5]["computed"] <= STEPS // 2, (ranks[4], ranks[5])
    assert max(ranks[4]["seconds"], ranks[5]["seconds"]) < 0.6 * STEPS * SLEEP_S, (ranks[4], ranks[5])
    check_rounds(recorded(tmp_path, 6), backup=True)  # each round the mean of the four ranks of two machines
