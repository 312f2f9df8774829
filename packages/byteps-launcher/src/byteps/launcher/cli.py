"""The ``bpslaunch`` command line.

::

    bpslaunch [-np L] [--workers W] [--servers K] [--force-distributed]
              [--grace-period SECONDS] [-q | -v] [--] COMMAND ...
    bpslaunch -H host1:2,host2:2 | --hostfile FILE [--servers K | --server-hosts h3,h4]
              [--ssh-port P] [--ssh-identity-file F] [--ssh-option KEY=VALUE] [-x NAME] [--] COMMAND ...

Without ``DMLC_ROLE`` in the environment (embedded mode) the whole job runs
on this machine; with it (role mode) this machine plays that role, as with
BytePS's launcher. With ``-H`` or ``--hostfile`` (Horovod's syntax) the job
runs on those hosts, each process started over ssh
(:mod:`byteps.launcher.ssh_mode`). As a task of an srun step (``srun
bpslaunch python train.py`` inside a SLURM allocation) it runs that task's
share of the job (:mod:`byteps.launcher.slurm_mode`). Exit status: the job's (see
:mod:`byteps.launcher.supervisor`), 2 for a usage or configuration error
(one line naming the fix), 130/143 when interrupted by SIGINT/SIGTERM.

A job shows itself: bpslaunch prints its plan once, the scheduler says when
it is up and when every node has registered, a node that waits says what
for, and bpslaunch ends with one summary line (wall time, rounds, bytes per
worker, the servers' share; from the reports its children leave in
``BYTEPS_REPORT_DIR``, see :mod:`byteps.common.job_report`). ``-q`` keeps
only errors (BYTEPS_LOG_LEVEL=ERROR for the children), ``-v`` adds the
processes' own INFO logs and the CPU placement.

Example::

    bpslaunch -np 2 -- python train.py --epochs 3
    DMLC_ROLE=worker DMLC_WORKER_ID=0 ... bpslaunch python train.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from byteps.common.config import ConfigError
from byteps.common.interface import distribution_version
from byteps.common.job_report import REPORT_DIR_VARIABLE, read_reports, summarize
from byteps.launcher.cpu_placement import place_workers
from byteps.launcher.elastic_mode import NO_LIMIT, ElasticOptions, ElasticSupervisor
from byteps.launcher.embedded_mode import EmbeddedOptions, embedded_plan, stale_variables
from byteps.launcher.hosts import parse_host_names, parse_hosts, read_hostfile
from byteps.launcher.job_plan import JobPlan, UsageError
from byteps.launcher.output import Console
from byteps.launcher.role_mode import role_plan
from byteps.launcher.slurm_mode import in_slurm_step, slurm_plan
from byteps.launcher.ssh import SshOptions, preflight
from byteps.launcher.ssh_mode import ssh_plan
from byteps.launcher.supervisor import DEFAULT_GRACE_PERIOD, Supervisor

__all__ = ["main", "build_parser"]

USAGE_ERROR = 2
EMBEDDED_ONLY = (("local_size", "-np"), ("num_worker", "--workers"), ("num_server", "--servers"))
VERBOSE_LEVELS = ("TRACE", "DEBUG", "INFO")
QUIET_LEVEL, VERBOSE_LEVEL = "ERROR", "INFO"  # BYTEPS_LOG_LEVEL for -q / -v, unless the user set one


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the fix (and exit 2), like every other bpslaunch error."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _non_negative(kind: Callable[[str], Any], expected: str) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)``, finite and >= 0; ``expected`` says what a bad text should be."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not value >= 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
        return value
    return parse


_non_negative_float = _non_negative(float, "a number of seconds")
_non_negative_int = _non_negative(int, "a whole number")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="bpslaunch",
        usage=(
            "%(prog)s [-np L] [--workers W] [--servers K] [--force-distributed] "
            "[--grace-period SECONDS] [-q | -v] [--] COMMAND ..."
        ),
        description=(
            "Start a byteps job and tear it all down on the first failure. Without DMLC_ROLE "
            "(embedded mode) the scheduler, servers and workers all run here on 127.0.0.1; with "
            "DMLC_ROLE set (role mode) this machine plays that role, configured by DMLC_*/BYTEPS_* "
            "variables."
        ),
        epilog=(
            "Each child's output is re-printed prefixed with its role and rank, e.g. '[worker 1] '. "
            "Exit status: the failed process's exit code (128+N if killed by signal N), 0 when every "
            "worker succeeded, 2 for a usage or configuration error."
        ),
    )
    parser.add_argument("-np", dest="local_size", type=int, default=None, metavar="L",
                        help="worker processes per worker machine (embedded mode; default 1)")
    parser.add_argument("--workers", dest="num_worker", type=int, default=None, metavar="W",
                        help="worker machines, i.e. DMLC_NUM_WORKER (embedded mode; default 1)")
    parser.add_argument("--servers", dest="num_server", type=int, default=None, metavar="K",
                        help="servers (embedded mode; default W when W > 1, 1 with --force-distributed, "
                             "else 0: one machine's processes sum in shared memory)")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", default=None, metavar="HOST:SLOTS,...",
                       help="run over ssh on these hosts, SLOTS worker processes each (Horovod's syntax)")
    hosts.add_argument("--hostfile", default=None, metavar="FILE",
                       help="the hosts, one 'host:slots' or 'host slots=N' per line")
    parser.add_argument("--server-hosts", default=None, metavar="HOST,...",
                        help="with -H/--hostfile: one server on each of these CPU hosts (default: --servers K "
                             "on the worker hosts, K = the number of hosts)")
    parser.add_argument("--ssh-port", type=int, default=None, metavar="PORT", help="ssh port of every host")
    parser.add_argument("--ssh-identity-file", default=None, metavar="FILE", help="ssh key to log in with")
    parser.add_argument("--ssh-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra ssh -o option (repeatable)")
    parser.add_argument("--remote-python", default=None, metavar="PATH",
                        help="the Python (with byteps) on the other hosts (default: the same path as this one's)")
    parser.add_argument("-x", dest="forward", action="append", default=[], metavar="NAME[=VALUE]",
                        help="also give remote processes this variable (BYTEPS_*, DMLC_*, PS_*, OMP_*, "
                             "PYTHONPATH and a few more go anyway)")
    parser.add_argument("--force-distributed", action="store_true",
                        help="use the scheduler and servers even for one worker process "
                             "(BYTEPS_FORCE_DISTRIBUTED=1)")
    parser.add_argument("--max-restarts", type=_non_negative_int, default=0, metavar="N",
                        help="after a failure, start the whole job again, up to N times, with BYTEPS_RESTART_COUNT "
                             "= 1, 2, ... in every process (embedded mode and -H hosts; default 0). A job "
                             "stopped by Ctrl-C or SIGTERM is not restarted")
    elastic = parser.add_argument_group(
        "elastic training", "Horovod's elastic mode: the job goes on when workers, servers or the scheduler are "
        "lost. Without a discovery script every worker process runs here as a host of one slot; hosts the script "
        "names are reached over ssh (the --ssh-* options, -x) (docs/elastic.md)")
    elastic.add_argument("--min-np", type=int, default=None, metavar="N",
                         help="the fewest workers the job goes on with (default: -np)")
    elastic.add_argument("--max-np", type=int, default=None, metavar="N",
                         help="the most workers the job grows to (default: -np, or no limit with a discovery script)")
    elastic.add_argument("--host-discovery-script", default=None, metavar="SCRIPT",
                         help="prints Horovod's host:slots lines (localhost:SLOTS for this machine); run every "
                              "second, more slots start more workers, who join at the next state.commit()")
    elastic.add_argument("--reset-limit", type=_non_negative_int, default=None, metavar="N",
                         help="fail the job after N changes of membership (default: no limit)")
    parser.add_argument("--grace-period", type=_non_negative_float, default=DEFAULT_GRACE_PERIOD,
                        metavar="SECONDS",
                        help="time between SIGTERM and SIGKILL when tearing the job down "
                             f"(default {DEFAULT_GRACE_PERIOD:g})")
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("-q", "--quiet", action="store_true",
                          help="print errors only: no plan, progress or summary lines")
    loudness.add_argument("-v", "--verbose", action="store_true",
                          help="also print every process's INFO log and where workers are pinned")
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {distribution_version('byteps-launcher')}")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                        help="what each worker process runs (ignored for DMLC_ROLE=server/scheduler)")
    return parser


def _environment(args: argparse.Namespace, report_dir: str) -> Dict[str, str]:
    """This process's environment plus what -q/-v and the job report ask of the children."""
    environ = dict(os.environ)
    environ[REPORT_DIR_VARIABLE] = report_dir
    if (args.quiet or args.verbose) and not environ.get("BYTEPS_LOG_LEVEL", "").strip():
        environ["BYTEPS_LOG_LEVEL"] = QUIET_LEVEL if args.quiet else VERBOSE_LEVEL
    return environ


#: Every process's attempt number under --max-restarts (Config.restart_count).
RESTART_COUNT_VARIABLE = "BYTEPS_RESTART_COUNT"
#: The modes in which this bpslaunch starts the whole job, so it can start all of it again.
RESTARTABLE_MODES = ("embedded", "ssh")


def _plan(args: argparse.Namespace, command: List[str], environ: Dict[str, str], console: Console) -> JobPlan:
    if args.hosts is not None or args.hostfile is not None:
        return _ssh_plan(args, command, environ)
    if args.server_hosts is not None:
        raise UsageError("--server-hosts needs -H or --hostfile")
    if in_slurm_step(environ) and not environ.get("DMLC_ROLE", "").strip():
        if args.num_worker is not None or args.force_distributed:
            raise UsageError("under srun the tasks are the worker machines (SLURM_NTASKS): drop --workers and "
                             "--force-distributed")
        return slurm_plan(environ, command, local_size=args.local_size, num_server=args.num_server)
    if environ.get("DMLC_ROLE", "").strip():
        given = [flag for attr, flag in EMBEDDED_ONLY if getattr(args, attr) is not None]
        if args.force_distributed:
            given.append("--force-distributed")
        if given:
            raise UsageError(
                f"{', '.join(given)} only apply in embedded mode; with DMLC_ROLE set, use "
                "BYTEPS_LOCAL_SIZE, DMLC_NUM_WORKER, DMLC_NUM_SERVER and BYTEPS_FORCE_DISTRIBUTED"
            )
        plan = role_plan(command, environ)
        if command and not plan.workers:
            console.note(f"DMLC_ROLE={plan.processes[0].role}: COMMAND is ignored; running byteps.server")
        return plan

    for name in stale_variables(environ):
        console.note(f"embedded mode (DMLC_ROLE unset) sets {name} itself; ignoring {name}={environ[name]!r}")
    options = EmbeddedOptions(
        local_size=1 if args.local_size is None else args.local_size,
        num_worker=1 if args.num_worker is None else args.num_worker,
        num_server=args.num_server,
        force_distributed=args.force_distributed,
    )
    return embedded_plan(options, command, environ)


def _ssh_options(args: argparse.Namespace) -> SshOptions:
    return SshOptions(port=args.ssh_port, identity_file=args.ssh_identity_file, options=tuple(args.ssh_option),
                      **({"python": args.remote_python} if args.remote_python else {}))


def _ssh_plan(args: argparse.Namespace, command: List[str], environ: Dict[str, str]) -> JobPlan:
    if environ.get("DMLC_ROLE", "").strip():
        raise UsageError("-H/--hostfile start every role themselves: unset DMLC_ROLE")
    given = [flag for attr, flag in EMBEDDED_ONLY[:2] if getattr(args, attr) is not None]
    if args.force_distributed:
        given.append("--force-distributed")
    if given:
        raise UsageError(f"{', '.join(given)} do not apply with -H/--hostfile: the hosts' slots are the worker "
                         "processes")
    hosts = parse_hosts(args.hosts) if args.hosts is not None else read_hostfile(args.hostfile)
    server_hosts = parse_host_names(args.server_hosts, "--server-hosts") if args.server_hosts else []
    options = _ssh_options(args)
    plan = ssh_plan(hosts, command, environ, num_server=args.num_server, server_hosts=server_hosts, ssh=options,
                    forward=args.forward)
    remote = sorted({p.host for p in plan.processes if p.host is not None})
    if remote:
        preflight(remote, options, distribution_version("byteps-launcher"))
    return plan


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run bpslaunch with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["kubernetes"]:  # manifests for a cluster, not a job here
        from byteps.launcher.kubernetes import main as kubernetes_main

        return kubernetes_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    console = Console()
    report_dir = tempfile.mkdtemp(prefix="bpslaunch-report-")
    try:
        return _run(args, command, report_dir, console)
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)


def _refuse(error: Exception, console: Console) -> int:
    """One line naming what to fix in the command line or the environment; bpslaunch's exit status 2."""
    if isinstance(error, ConfigError):
        console.note(f"configuration error: {error}")
    else:
        console.note(f"error: {error} (see bpslaunch --help)")
    return USAGE_ERROR


def _is_elastic(args: argparse.Namespace) -> bool:
    return any(value is not None for value in (args.min_np, args.max_np, args.host_discovery_script,
                                               args.reset_limit))


def _elastic_supervisor(args: argparse.Namespace, command: List[str], environ: Dict[str, str],
                        console: Console) -> ElasticSupervisor:
    """The elastic job the command line asks for; UsageError for flags it cannot take."""
    refused = [flag for flag, given in (
        ("-H/--hostfile", args.hosts is not None or args.hostfile is not None),
        ("--workers", args.num_worker is not None), ("--force-distributed", args.force_distributed),
        ("--max-restarts", bool(args.max_restarts)), ("DMLC_ROLE", bool(environ.get("DMLC_ROLE", "").strip())),
        ("srun", in_slurm_step(environ))) if given]
    if refused:
        raise UsageError(f"elastic mode (--min-np/--max-np/--host-discovery-script/--reset-limit) finds its hosts "
                         f"with --host-discovery-script (or runs -np workers on this machine); drop "
                         f"{', '.join(refused)}")
    np = args.local_size if args.local_size is not None else args.min_np if args.min_np is not None else None
    if np is None:
        raise UsageError("elastic mode needs -np (how many workers to start with) or --min-np")
    max_np = args.max_np if args.max_np is not None else NO_LIMIT if args.host_discovery_script else np
    options = ElasticOptions(np=np, min_np=args.min_np if args.min_np is not None else np, max_np=max_np,
                             discovery_script=args.host_discovery_script,
                             num_server=1 if args.num_server is None else args.num_server,
                             reset_limit=args.reset_limit)
    for name in stale_variables(environ):
        console.note(f"elastic mode sets {name} itself; ignoring {name}={environ[name]!r}")
    return ElasticSupervisor(options, command, environ, console, grace_period=args.grace_period,
                             ssh=_ssh_options(args), forward=args.forward)


def _run_elastic(args: argparse.Namespace, command: List[str], report_dir: str, console: Console) -> int:
    started = time.monotonic()
    try:
        supervisor = _elastic_supervisor(args, command, _environment(args, report_dir), console)
        if not args.quiet:
            options = supervisor.options
            console.note(f"elastic job: {options.np} worker(s) to start, between {options.min_np} and "
                         f"{options.max_np if options.max_np < NO_LIMIT else 'any number of'} worker(s), "
                         f"{options.num_server} server(s) per membership epoch")
        outcome = supervisor.run()
    except (ConfigError, UsageError) as exc:
        return _refuse(exc, console)
    if not args.quiet:
        wall_s = time.monotonic() - started
        changes = f"; membership changed {supervisor.resets} time(s)" if supervisor.resets else ""
        if outcome.ok:
            console.note(f"elastic job finished in {wall_s:.1f} s{changes}")
            applied = supervisor.async_pushes_by_epoch()
            if any(applied.values()):
                console.note("servers applied asynchronous pushes: " + ", ".join(
                    f"{count} in membership epoch {number}" for number, count in sorted(applied.items())))
        else:
            console.note(f"job failed after {wall_s:.1f} s with exit status {outcome.exit_code}{changes}")
    return outcome.exit_code


def _run(args: argparse.Namespace, command: List[str], report_dir: str, console: Console) -> int:
    """Plan and run the job; with --max-restarts, again after a failure, with the next BYTEPS_RESTART_COUNT."""
    if _is_elastic(args):
        return _run_elastic(args, command, report_dir, console)
    started = time.monotonic()
    attempts = args.max_restarts + 1
    for attempt in range(attempts):
        try:
            environ = _environment(args, report_dir)
            environ[RESTART_COUNT_VARIABLE] = str(attempt)
            plan = _plan(args, command, environ, console)
            if args.max_restarts and plan.mode not in RESTARTABLE_MODES:
                raise UsageError(
                    f"--max-restarts restarts the whole job, which only a bpslaunch that starts all of it can do "
                    f"(embedded mode, or -H hosts over ssh); this one runs in {plan.mode} mode: let the cluster "
                    "restart its tasks (e.g. SLURM's --requeue, a Kubernetes Job's backoffLimit)")
            verbose = plan.processes[0].config().log_level in VERBOSE_LEVELS
            if not args.quiet and attempt == 0:
                console.note(plan.describe())
            if plan.mode != "ssh":  # other hosts' cores are theirs to place
                plan = place_workers(plan, report=console.note if verbose and attempt == 0 else None)
        except (ConfigError, UsageError) as exc:
            return _refuse(exc, console)
        except KeyboardInterrupt:
            return 130

        outcome = Supervisor(plan, grace_period=args.grace_period, console=console).run()
        if outcome.ok or outcome.interrupted or attempt + 1 == attempts:
            break
        console.note(f"attempt {attempt + 1} of {attempts} failed ({outcome.reason}; exit status "
                     f"{outcome.exit_code}); restarting the job with {RESTART_COUNT_VARIABLE}={attempt + 1}")
        for leftover in os.listdir(report_dir):  # the summary counts the last attempt only
            os.unlink(os.path.join(report_dir, leftover))
    if not args.quiet:
        wall_s = time.monotonic() - started
        restarts = f"; restarted {attempt} time{'s' if attempt > 1 else ''}" if attempt else ""
        if outcome.ok:
            console.note(summarize(read_reports(report_dir), wall_s) + restarts)
        else:
            console.note(f"job failed after {wall_s:.1f} s with exit status {outcome.exit_code}{restarts}")
    return outcome.exit_code
