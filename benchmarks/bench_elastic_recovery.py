"""How long a lost process costs an elastic job, against restarting the whole job (--max-restarts).

Each run starts a real job of byteps.common workers (the elastic tests'
worker: one 32 KiB push_pull and one commit per step, a pause between
steps), kills one process with SIGKILL after step 4, and times, as the
job's output arrives here, from the kill to the first step completed
after it:

* elastic, worker lost: ``-np 3 --min-np 2``, worker w2 killed;
* elastic over ssh hosts (``--ssh``): the same with each worker on a host
  of its own (127.0.0.2-4, an sshd each, found by a discovery script),
  reading the membership from bpslaunch's rendezvous service; the killed
  worker's host is dropped from discovery just before the kill;
* elastic, server lost: ``-np 2 --min-np 2 --servers 2``, one server killed;
* elastic, scheduler lost: the same, the scheduler killed (a dead
  scheduler tells no one: the workers see bpslaunch publish the next epoch);
* baseline, restart: ``-np 3 --max-restarts 1``, worker 2 killed; the
  whole job starts again (and, having no checkpoint, from step 1).

Run (about a minute on 2 cores, nothing else running)::

    python benchmarks/bench_elastic_recovery.py --repeats 3 [--ssh]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import tempfile
import time
from typing import Optional

from byteps.testkit import DiscoveryScript, SshHosts, WatchedJob, children_with_variable, processes_with_variable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "packages", "byteps-launcher", "tests", "elastic_worker.py")
STEP = re.compile(r"^\[worker 0\] step (\d+) ")


def first_step_after(job: WatchedJob, mark: int, timeout: float = 60) -> float:
    job.wait_for(r"^\[worker 0\] step \d+ ", timeout=timeout, after=mark)
    return time.monotonic()


SSH_HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


def one_run(case: str, hosts: Optional[SshHosts] = None, folder: str = "") -> float:
    discovery = DiscoveryScript(folder, "\n".join(f"{h}:1" for h in SSH_HOSTS)) if case == "ssh" else None
    flags = {"worker": ["-np", "3", "--min-np", "2"],
             "ssh": ["-np", "3", "--min-np", "2", "--max-np", "3", "--host-discovery-script",
                     discovery.path if discovery else "", *(hosts.launcher_args() if hosts else [])],
             "server": ["-np", "2", "--min-np", "2", "--servers", "2"],
             "scheduler": ["-np", "2", "--min-np", "2", "--servers", "2"],
             "restart": ["-np", "3", "--max-restarts", "1"]}[case]
    with WatchedJob(flags, WORKER, ["12", "0.1"]) as job:
        job.wait_for(r"^\[worker 0\] step 4 ")
        if case == "ssh":
            discovery.report("\n".join(f"{h}:1" for h in SSH_HOSTS[:2]))
            [victim] = processes_with_variable("BYTEPS_ELASTIC_WORKER", "w2")
        elif case == "worker":
            victim = job.child_pid("BYTEPS_ELASTIC_WORKER", "w2")
        elif case == "restart":
            victim = [p for p in children_with_variable(job.process.pid, "DMLC_ROLE", "worker")
                      if b"HOROVOD_RANK=2" in open(f"/proc/{p}/environ", "rb").read().split(b"\0")][0]
        else:
            victim = children_with_variable(job.process.pid, "DMLC_ROLE", case)[0]
        mark = len(job.lines)
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        if case != "restart":  # the step after the survivors rejoined
            mark = job.wait_for(r"^\[worker 0\] joined ", timeout=60, after=mark) and len(job.lines) - 1
        else:
            mark = job.wait_for(r"^\[worker 0\] joined - rank 0 of 3 at step 0", timeout=60, after=mark) and \
                len(job.lines) - 1
        recovered = first_step_after(job, mark)
        result = job.finish(timeout=120)
        assert result.returncode == 0, result.stdout[-3000:]
    return recovered - killed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ssh", action="store_true", help="also the worker case over ssh hosts (needs sshd)")
    args = parser.parse_args()
    results = {}
    for case in ("restart", "worker", "server", "scheduler"):
        results[case] = [one_run(case) for _ in range(args.repeats)]
    if args.ssh:
        with tempfile.TemporaryDirectory() as folder, SshHosts(os.path.join(folder, "ssh"), SSH_HOSTS) as hosts:
            results["ssh"] = [one_run("ssh", hosts, folder) for _ in range(args.repeats)]
    baseline = statistics.median(results["restart"])
    print(f"{'lost':<22}{'median s':>10}{'min s':>8}{'max s':>8}{'vs restart':>12}")
    labels = {"restart": "worker (restart job)", "worker": "worker (elastic)", "server": "server (elastic)",
              "scheduler": "scheduler (elastic)", "ssh": "worker (elastic, ssh)"}
    for case, times in results.items():
        median = statistics.median(times)
        print(f"{labels[case]:<22}{median:>10.2f}{min(times):>8.2f}{max(times):>8.2f}{median / baseline:>11.2f}x")


if __name__ == "__main__":
    main()
