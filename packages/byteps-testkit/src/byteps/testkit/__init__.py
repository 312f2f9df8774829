"""byteps-testkit: what the tests of every byteps package share (not a runtime dependency of anything).

* :func:`free_port` (:mod:`.ports`): a port for a scheduler on 127.0.0.1;
* :func:`clean_env`, :func:`unset_byteps_env` (:mod:`.environment`): this
  environment without byteps' knobs, for a child or for the test itself;
* :func:`run_job` / :func:`start_job` (:mod:`.role_job`): scheduler, servers
  and workers as processes with role environments, no launcher, every one
  killed by process group when the job ends or the test fails;
* :func:`launch_job` (:mod:`.launched_job`): a script under the real
  bpslaunch, with :func:`rank_lines` and :func:`assert_all_ok` to read it;
  its worker side, in the launched script: :mod:`.checks` (``Checks``,
  ``check``, ``expect_error``: ``OK <name>`` lines and ``ALL OK <n>``);
* :class:`WatchedJob` (:mod:`.watched_job`): a bpslaunch job read line by
  line while it runs, whose processes a test can find and kill; with
  :class:`DiscoveryScript`, the host list an elastic job discovers;
  :func:`processes_with_variable` and :func:`variable_of`: a job's processes
  found by a variable in their environment (e.g. BYTEPS_JOB_ID), and their role;
* :func:`kill_group`, :func:`is_alive`, :func:`wait_until_dead`
  (:mod:`.processes`): process clean-up;
* :class:`SshHosts` (:mod:`.ssh_hosts`): a real ``sshd`` per loopback
  address, for bpslaunch's ssh mode;
* :class:`SlurmCluster` (:mod:`.slurm_cluster`): munged, slurmctld and
  slurmd for a one-node SLURM cluster, or a slurmd per network namespace
  for several nodes, for bpslaunch under srun;
* ``python -m byteps.testkit.push_pull_worker SPEC`` (:mod:`.push_pull_worker`):
  the reference worker program of server and worker jobs.

The library imports no byteps package: it starts their programs as
processes, so installing it changes nothing that a test checks. Only the
worker program, run inside a job, uses byteps-common (and numpy), which the
package under test brings.

Example::

    from byteps.testkit import run_job
    result = run_job([sys.executable, "worker.py"], num_workers=2, num_servers=1)
    assert all(code == 0 for code in result.codes.values()), result.failures()
"""

from byteps.testkit.environment import clean_env, one_process_adapter, unset_byteps_env
from byteps.testkit.launched_job import JOB_LAYOUTS, LAUNCHER, assert_all_ok, launch_job, rank_lines, report, tail
from byteps.testkit.ports import free_port
from byteps.testkit.processes import is_alive, kill_group, process_state, wait_until_dead
from byteps.testkit.role_job import JobResult, RunningJob, run_job, start_job
from byteps.testkit.slurm_cluster import SlurmCluster, slurm_available
from byteps.testkit.ssh_hosts import SshHosts, sshd_available
from byteps.testkit.watched_job import (
    DiscoveryScript,
    WatchedJob,
    children_with_variable,
    processes_with_variable,
    variable_of,
)

__all__ = [
    "JOB_LAYOUTS",
    "LAUNCHER",
    "JobResult",
    "RunningJob",
    "SlurmCluster",
    "SshHosts",
    "assert_all_ok",
    "clean_env",
    "free_port",
    "is_alive",
    "kill_group",
    "launch_job",
    "one_process_adapter",
    "process_state",
    "rank_lines",
    "report",
    "run_job",
    "slurm_available",
    "sshd_available",
    "start_job",
    "tail",
    "unset_byteps_env",
    "wait_until_dead",
    "WatchedJob",
    "DiscoveryScript",
    "children_with_variable",
    "processes_with_variable",
    "variable_of",
]
