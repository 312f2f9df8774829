"""run_job/start_job with stand-in programs (no byteps needed), and reading bpslaunch output."""

from __future__ import annotations

import os
import subprocess
import sys

from byteps.testkit import assert_all_ok, rank_lines, run_job, start_job, wait_until_dead

# The scheduler and servers: print their role and exit (or, with SLEEP set, hang).
SERVER = [sys.executable, "-c",
          "import os, time; print(os.environ['DMLC_ROLE'], flush=True); "
          "time.sleep(300) if os.environ.get('SLEEP') else None"]
WORKER = [sys.executable, "-c",
          "import os; print('worker', os.environ['DMLC_WORKER_ID'], os.environ['BYTEPS_LOCAL_RANK'], "
          "os.environ['DMLC_PS_ROOT_PORT'], os.environ.get('EXTRA'))"]


def test_every_process_gets_its_role_and_the_logs_are_collected_and_removed():
    job = start_job(WORKER, num_workers=2, num_servers=1, local_size=2, env={"EXTRA": "e"}, server_argv=SERVER,
                    overrides={"worker3": {"EXTRA": "own"}})
    logs = [handle.name for handle in job.logs.values()]
    try:
        assert job.wait(30)
    finally:
        result = job.finish()
    assert result.codes == {name: 0 for name in ("scheduler", "server0", "worker0", "worker1", "worker2", "worker3")}
    assert result.outputs["scheduler"] == "scheduler\n" and result.outputs["server0"] == "server\n"
    assert result.outputs["worker2"] == f"worker 1 0 {job.port} e\n"
    assert result.outputs["worker3"] == f"worker 1 1 {job.port} own\n"
    assert not [path for path in logs if os.path.exists(path)]


def test_a_timed_out_job_is_killed_with_everything_it_forked(tmp_path):
    pidfile = tmp_path / "pid"
    hang = [sys.executable, "-c",
            f"import subprocess, time; p = subprocess.Popen(['sleep', '300']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(300)"]
    result = run_job(hang, 1, 1, server_argv=SERVER, env={"SLEEP": "1"}, timeout=2)
    assert result.timed_out and result.codes["worker0"] == -9 and result.codes["server0"] == -9
    assert wait_until_dead([int(pidfile.read_text())], timeout=5) == []


def test_a_failing_process_ends_the_wait_and_failures_shows_it():
    fail = [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
    result = run_job(fail, 1, 1, server_argv=SERVER, env={"SLEEP": "1"}, timeout=60)
    assert not result.timed_out and result.codes["worker0"] == 3
    assert "--- worker0 exited 3:\nboom" in result.failures()


def test_rank_lines_and_assert_all_ok_read_bpslaunch_prefixes():
    out = "[worker 0] ALL OK 2\n[worker 1] x\n[worker 1] ALL OK 2\n[server 0] ALL OK 2\n"
    result = subprocess.CompletedProcess([], 0, stdout=out, stderr="")
    assert rank_lines(out, 1) == ["x", "ALL OK 2"]
    assert_all_ok(result, checks=2)
    try:
        assert_all_ok(subprocess.CompletedProcess([], 1, stdout=out, stderr="err"), checks=2)
    except AssertionError as exc:
        assert "exit 1" in str(exc) and "err" in str(exc)
    else:
        raise AssertionError("a non-zero exit passed")


def test_checks_print_ok_lines_and_a_failure_exits_at_once():
    script = ("from byteps.testkit.checks import Checks, expect_error\n"
              "checks = Checks()\n"
              "checks.run('first', lambda: None)\n"
              "checks.run('raises', lambda: expect_error(ValueError, 'bad', lambda: int('bad')))\n"
              "checks.done()\n"
              "checks.run('fails', lambda: expect_error(KeyError, 'x', lambda: None))\n"
              "print('not reached')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    lines = result.stdout.splitlines()
    assert result.returncode == 1 and lines[:3] == ["OK first", "OK raises", "ALL OK 2"], result.stdout
    assert lines[3].startswith("FAIL fails: Traceback") and "no KeyError ('x') was raised" in result.stdout
    assert "not reached" not in result.stdout
