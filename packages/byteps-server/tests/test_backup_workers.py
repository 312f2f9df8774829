"""Backup workers (BYTEPS_BACKUP_WORKERS): rounds close without the slowest machine, and never mix rounds."""

import json
import os
import re
import sys

from byteps.server.parameter_server import BACKUP_MAX_LAG
from byteps.testkit import run_job, start_job

BACKUP_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backup_worker.py")
ROUNDS = 12


def rounds_seen(output):
    return [(int(r), int(t), tuple(int(x) for x in ranks.split(",")))
            for r, t, ranks in re.findall(r"ROUND (\d+) GOT (\d+) RANKS ([\d,]+)", output)]


def took(output):
    return float(re.search(r"took (\S+) s", output).group(1))


def run(tmp_path, backup, rounds=ROUNDS, env=None, extra=()):
    reports = tmp_path / "reports"
    reports.mkdir()
    result = run_job([sys.executable, BACKUP_WORKER, str(rounds), "2", "0.3", *extra], 3, 1,
                     env={"BYTEPS_BACKUP_WORKERS": str(backup), "BYTEPS_REPORT_DIR": str(reports), **(env or {})},
                     timeout=60)
    server = reports / "server-0.json"
    return result, json.loads(server.read_text()) if server.exists() else None


def test_three_workers_one_backup_close_rounds_with_the_two_fast_ones(tmp_path):
    result, server = run(tmp_path, 1)
    assert not result.timed_out and all(code == 0 for code in result.codes.values()), result.failures()
    fast = {rank: rounds_seen(result.outputs[f"worker{rank}"]) for rank in (0, 1)}
    for rank, seen in fast.items():
        assert len(seen) == ROUNDS, seen
        for round_, got, ranks in seen:
            # A fast rank's own push is in its round's sum, with another rank's push of that same round.
            assert got == round_ and rank in ranks, seen
    slow = rounds_seen(result.outputs["worker2"])
    # The slow rank gets every round's sum exactly as the others got it (so it applies the same updates),
    # mostly without its own push, which came late and was dropped.
    assert slow == fast[0] == fast[1], (slow, fast)
    late = sum(2 not in ranks for _, _, ranks in slow)
    assert server is not None and server["late_pushes"] == late >= ROUNDS // 2, (server, slow)
    # The fast ranks ran ahead of the slow one (12 x 0.3 s = 3.6 s), by BACKUP_MAX_LAG rounds at most.
    fast_s = max(took(result.outputs["worker0"]), took(result.outputs["worker1"]))
    slow_s = took(result.outputs["worker2"])
    assert (ROUNDS - BACKUP_MAX_LAG - 2) * 0.3 <= fast_s < slow_s - 0.3 * (BACKUP_MAX_LAG - 1), (fast_s, slow_s)


def test_a_worker_behind_skips_the_rounds_that_closed_without_it(tmp_path):
    result, server = run(tmp_path, 1, extra=["skip"])
    assert not result.timed_out and all(code == 0 for code in result.codes.values()), result.failures()
    fast = rounds_seen(result.outputs["worker0"])
    slow = rounds_seen(result.outputs["worker2"])
    assert slow == fast == rounds_seen(result.outputs["worker1"]) and len(slow) == ROUNDS, (slow, fast)
    skipped = result.outputs["worker2"].count("SKIPPED")
    computed = ROUNDS - skipped
    # The slow rank sleeps only for the rounds it computes; the others closed the rest without it.
    assert skipped >= ROUNDS // 2, result.outputs["worker2"]
    assert took(result.outputs["worker2"]) < 0.3 * computed + 1.0, result.outputs["worker2"]
    assert took(result.outputs["worker2"]) < 0.3 * ROUNDS * 0.6
    assert server["late_pushes"] <= computed


def test_without_backup_workers_every_round_waits_for_everyone(tmp_path):
    result, server = run(tmp_path, 0, rounds=3)
    # Every sum holds three ranks then: the two-rank decoding refuses it, on every rank.
    for rank in range(3):
        assert "is not two ranks' pushes of one round" in result.outputs[f"worker{rank}"]


def test_a_worker_with_another_backup_setting_is_refused_at_rendezvous():
    job = start_job([sys.executable, BACKUP_WORKER, "2", "2", "0"], 3, 1, env={"BYTEPS_BACKUP_WORKERS": "1"},
                    timeout=30, overrides={"worker1": {"BYTEPS_BACKUP_WORKERS": "0"}})
    try:
        job.wait(30)
    finally:
        result = job.finish(True)
    text = "\n".join(result.outputs.values())
    assert re.search(r"BYTEPS_BACKUP_WORKERS='[01]' but .* has BYTEPS_BACKUP_WORKERS='[01]'", text), text[-3000:]
    assert all(code != 0 for name, code in result.codes.items()), result.codes
