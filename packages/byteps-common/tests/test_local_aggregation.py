"""Local aggregation, scheduling credit and priority in real jobs on 127.0.0.1.

Several worker processes per machine sum in shared memory first; each
partition crosses the network once per machine (checked with the
transport's byte counters). The push order a server sees follows the
declaration order within the scheduling credit.
"""

import glob
import json
import os
import re
import signal
import sys
import time

import pytest

from byteps.testkit import run_job, start_job

HERE = os.path.dirname(__file__)
PUSH_PULL = [sys.executable, "-m", "byteps.testkit.push_pull_worker"]
BYTES = [sys.executable, os.path.join(HERE, "bytes_worker.py")]
PRIORITY = [sys.executable, os.path.join(HERE, "priority_worker.py")]
MISMATCH = [sys.executable, os.path.join(HERE, "mismatch_local_worker.py")]
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]


def tensors(counts, dtypes=DTYPES):
    return [{"name": f"{dtype}.{count}.{avg}", "dtype": dtype, "count": count, "average": avg == "avg"}
            for dtype in dtypes for count in counts for avg in ("avg", "sum")]


def assert_ok(result):
    assert not result.timed_out, "job timed out:\n" + result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()


@pytest.mark.parametrize("machines,local_size,servers,extra", [
    (1, 2, 0, {}),  # one machine: shared memory only, no server
    (1, 3, 1, {"BYTEPS_FORCE_DISTRIBUTED": "1"}),  # roots push through a server
    (2, 2, 2, {}),
    (2, 3, 1, {"BYTEPS_PIPELINE": "0"}),  # push everything, then pull
    (2, 2, 2, {"BYTEPS_SCHEDULING_CREDIT": "1"}),
])
def test_local_aggregation_matches_numpy(machines, local_size, servers, extra):
    spec = {"rounds": 3, "async": True, "tensors": tensors([1, 7, 1001, 4099])}
    env = {"BYTEPS_PARTITION_BYTES": "4000", **extra}
    result = run_job(PUSH_PULL + [json.dumps(spec)], machines, servers, local_size=local_size, env=env)
    assert_ok(result)
    size = machines * local_size
    for rank in range(size):
        assert f"rank {rank} of {size}: 3 rounds" in result.outputs[f"worker{rank}"]


def machine_bytes(result, machines):
    totals = {m: [0, 0] for m in range(machines)}
    for text in result.outputs.values():
        for machine, sent, received in re.findall(r"BYTES machine (\d+) sent (\d+) received (\d+)", text):
            totals[int(machine)][0] += int(sent)
            totals[int(machine)][1] += int(received)
    return totals


def test_network_bytes_per_machine_do_not_grow_with_local_size():
    rounds, count = 4, 250_000  # 1 MB per round, several partitions over 2 servers
    payload = rounds * count * 4
    seen = {}
    for local_size in (1, 2, 4):
        result = run_job(BYTES + [str(rounds), str(count)], 2, 2, local_size=local_size,
                         env={"BYTEPS_PARTITION_BYTES": "200000"})
        assert_ok(result)
        seen[local_size] = machine_bytes(result, 2)
    for local_size, totals in seen.items():
        for machine, (sent, received) in totals.items():
            # the payload once per direction, plus headers and INIT_KEY descriptions
            assert payload <= sent <= payload * 1.01, (local_size, machine, sent, payload)
            assert payload <= received <= payload * 1.01, (local_size, machine, received, payload)
    assert seen[4][0][0] <= seen[1][0][0] * 1.01, seen


def test_gathers_and_broadcasts_move_only_the_bytes_they_need():
    """A gather's buffer is zeros outside each rank's bytes, a broadcast's on every rank but the root:
    those partitions go to the servers as headers flagged zeros (FLAG_ZEROS). A rank already holds the sum
    of its own bytes, of the padding and (the root) of a broadcast: those are pulled bare (FLAG_BARE), a
    header back once the round is complete. The results stay exact."""
    count = 250_000  # 1 MB per rank; the gather's buffer is 2 MiB, in 200 kB partitions over 2 servers
    result = run_job([sys.executable, os.path.join(HERE, "gather_bytes_worker.py"), str(count)], 2, 2,
                     env={"BYTEPS_PARTITION_BYTES": "200000"})
    assert_ok(result)
    text = "\n".join(result.outputs.values())
    gathers = {int(w): (int(s), int(r), int(b)) for w, s, r, b in
               re.findall(r"GATHER (\d) sent (\d+) received (\d+) buffer (\d+)", text)}
    broadcasts = {int(w): (int(s), int(r)) for w, s, r in re.findall(r"BROADCAST (\d) sent (\d+) received (\d+)", text)}
    assert sorted(gathers) == sorted(broadcasts) == [0, 1], text
    for sent, received, buffer in gathers.values():
        # its own 1 MB (out) or the other rank's (back), at most two partitions shared with the other rank,
        # headers and the describe table: not the whole buffer
        assert count * 4 <= sent <= count * 4 + 2 * 200_000 + 20_000 < buffer, (sent, buffer)
        assert count * 4 <= received <= count * 4 + 2 * 200_000 + 20_000 < buffer, (received, buffer)
    assert count * 4 <= broadcasts[0][0] <= count * 4 * 1.01 and broadcasts[0][1] < 10_000, broadcasts
    assert broadcasts[1][0] < 10_000 and count * 4 <= broadcasts[1][1] <= count * 4 * 1.01, broadcasts
    scatters = {int(w): (int(s), int(r)) for w, s, r in re.findall(r"SCATTER (\d) sent (\d+) received (\d+)", text)}
    assert sorted(scatters) == [0, 1], text
    for sent, received in scatters.values():  # 2 MB pushed, its 1 MB of rows (and a shared partition) back
        assert 2 * count * 4 <= sent <= 2 * count * 4 * 1.01, scatters
        assert count * 4 <= received <= count * 4 + 200_000 + 10_000, scatters


@pytest.mark.parametrize("servers", [0, 1])
def test_local_peers_copy_and_sum_only_the_bytes_a_gather_has(servers):
    """Inside a machine, a gather's partitions outside a rank's rows are zeros there: the rank copies nothing
    into shared memory for them and the root sums only the slots with bytes, so each partition costs one
    copy in; a rank copies out only the other ranks' rows. A broadcast's non-roots copy nothing in, its root
    nothing out. A partition no local rank has bytes in goes to the servers as a header flagged zeros. The
    results stay exact (checked by the worker)."""
    count, local_size = 1000, 3  # 4000 bytes per rank, one partition each: no partition straddles two ranks
    result = run_job([sys.executable, os.path.join(HERE, "gather_bytes_worker.py"), str(count)], 1, servers,
                     local_size=local_size, env={"BYTEPS_PARTITION_BYTES": "4000"})
    assert_ok(result)
    text = "\n".join(result.outputs.values())
    counts = r"copied (\d+) summed (\d+) out (\d+)"
    gathers = {int(r): tuple(map(int, n)) for r, *n in re.findall(r"LOCAL GATHER (\d) " + counts, text)}
    broadcasts = {int(r): tuple(map(int, n)) for r, *n in re.findall(r"LOCAL BROADCAST (\d) " + counts, text)}
    assert sorted(gathers) == sorted(broadcasts) == list(range(local_size)), text
    table = 4000  # at most: the describe step's table (a few int64 per rank), copied and summed whole
    for copied, _, out in gathers.values():
        assert count * 4 <= copied <= count * 4 + table, gathers  # its own rows, not the 16 KiB buffer
        # the other ranks' rows: its own and the padding are in its buffer already
        assert (local_size - 1) * count * 4 <= out <= (local_size - 1) * count * 4 + table, gathers
    assert sum(summed for _, summed, _ in gathers.values()) <= local_size - 1, gathers  # the table's partition only
    # the root copies its tensor in (its peers read it there) and keeps its output; the others copy it out
    assert broadcasts[0] == (count * 4, 0, 0), broadcasts
    assert all(broadcasts[r] == (0, 0, count * 4) for r in (1, 2)), broadcasts
    if servers:  # the buffer's padding is zeros on every local rank: its partitions go to the server as headers
        sent = [int(n) for n in re.findall(r"GATHER \d sent (\d+) received \d+ buffer", text)]
        assert len(sent) == local_size and sum(sent) < 4 * 4096, sent  # 12,000 bytes and headers, not 16 KiB


def test_two_jobs_on_one_machine_do_not_collide():
    spec = {"rounds": 5, "tensors": tensors([1001, 30000], ["float32"])}
    jobs = [start_job(PUSH_PULL + [json.dumps(spec)], 1, 0, local_size=2) for _ in range(2)]
    try:
        for job in jobs:
            assert job.wait(120), "a job timed out"
    finally:
        results = [job.finish() for job in jobs]
    for result in results:
        assert_ok(result)


def test_a_local_rank_that_leaves_right_after_init_strands_no_other():
    # Local ranks prove the job secret to each other both ways during init. A rank that returned from init
    # once its own proofs were accepted, before its peers' proofs had reached it, stopped answering them and,
    # if it then shut down at once, left a peer waiting out BYTEPS_RENDEZVOUS_TIMEOUT. The race was lost
    # about one time in three; every run must pass.
    script = "import byteps.common as bps; bps.init(); bps.shutdown()"
    for _ in range(4):
        result = run_job([sys.executable, "-c", script], 1, 0, local_size=2, timeout=60,
                         env={"BYTEPS_JOB_SECRET": "s" * 32, "BYTEPS_RENDEZVOUS_TIMEOUT": "20"})
        assert_ok(result)


@pytest.mark.parametrize("what", ["size", "dtype"])
def test_local_ranks_that_disagree_fail_on_every_rank(what):
    started = time.monotonic()
    job = start_job(MISMATCH + [what], 1, 0, local_size=2, timeout=60)
    try:
        finished = job.wait(60, stop_on_failure=False)
    finally:
        result = job.finish(not finished)
    assert not result.timed_out and time.monotonic() - started < 30
    for rank in range(2):
        out = result.outputs[f"worker{rank}"]
        assert result.codes[f"worker{rank}"] == 3, out
        assert re.search(r"mismatch for tensor id 0: worker [01] declares tensor 'w'", out), out
    text = result.outputs["worker0"] + result.outputs["worker1"]
    fragment = "4004 bytes of float32" if what == "size" else "4000 bytes of int32"
    assert fragment in text, text


def pushes_seen_by(server_log: str, what: str = "PUSH"):
    return re.findall(what + r" key \d+ round 1 (?:from|to) worker 0 \((t\d)\)", server_log)


@pytest.mark.parametrize("credit,schedule,expected", [
    ("1", "0", ["t5", "t0", "t1", "t2", "t3", "t4"]),  # t5 alone in flight, then by declaration order
    ("0", "0", ["t5", "t4", "t3", "t2", "t1", "t0"]),  # no credit bound: everything goes as it comes
    # ... unless the server orders what waits for it (BYTEPS_SERVER_ENABLE_SCHEDULE): declaration order
    ("0", "1", ["t0", "t1", "t2", "t3", "t4", "t5"]),
])
def test_push_order_on_the_wire_follows_priority_within_the_credit(tmp_path, credit, schedule, expected):
    flag = tmp_path / "go"
    env = {"BYTEPS_FORCE_DISTRIBUTED": "1", "PS_VERBOSE": "2", "BYTEPS_SCHEDULING_CREDIT": credit,
           "BYTEPS_PARTITION_BYTES": "65536", "PS_HEARTBEAT_TIMEOUT": "60", "BYTEPS_SERVER_ENABLE_SCHEDULE": schedule}
    # With server-side scheduling the six pushes must wait at the server together: tiny ones arrive in one
    # read of its socket (64 KiB ones trickle in while it already handles the first).
    job = start_job(PRIORITY + [str(flag)] + (["16"] if schedule == "1" else []), 1, 1, env=env, timeout=60)
    try:
        deadline = time.monotonic() + 60
        while "READY" not in job.output("worker0"):
            assert time.monotonic() < deadline and job.procs["worker0"].poll() is None, job.output("worker0")
            time.sleep(0.05)
        server = job.procs["server0"]
        os.kill(server.pid, signal.SIGSTOP)  # no PUSH_ACK can come back: the credit stays spent
        try:
            flag.write_text("go")
            while "SUBMITTED" not in job.output("worker0"):
                assert time.monotonic() < deadline, job.output("worker0")
                time.sleep(0.05)
            time.sleep(0.3)  # the comm thread queues what it cannot send
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert job.wait(60), "job timed out"
    finally:
        result = job.finish()
    assert_ok(result)
    assert pushes_seen_by(result.outputs["server0"]) == expected, result.outputs["server0"][-3000:]
    # The sums are answered in the order their pushes were summed.
    assert pushes_seen_by(result.outputs["server0"], "ANSWER") == expected, result.outputs["server0"][-3000:]


def test_shared_memory_names_are_gone_once_the_job_runs():
    spec = {"rounds": 2, "tensors": tensors([5000], ["float32"])}
    job_id = f"t{os.getpid()}x"
    result = run_job(PUSH_PULL + [json.dumps(spec)], 1, 0, local_size=3, env={"BYTEPS_JOB_ID": job_id})
    assert_ok(result)
    assert glob.glob(f"/dev/shm/byteps-{job_id}-*") == []
