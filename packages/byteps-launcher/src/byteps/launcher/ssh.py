"""Starting a child on another host over ssh, so that it dies with its launcher.

A remote child is ``ssh HOST PYTHON -m byteps.launcher.remote``: the
command line carries no setting. The child's command and environment
(job secret included) travel as one JSON line on ssh's standard input,
which then stays open: :mod:`byteps.launcher.remote` on the other end
starts the child in a process group of its own and kills that group when
its input closes, i.e. when this side's ssh client is gone (bpslaunch ended
it, or died). ssh's exit status is the child's.

:func:`preflight` asks every host, in parallel and before anything starts,
for the byteps-launcher version its Python has: an unreachable host, a host
without byteps and a host with another version each become one clear error.

Example::

    options = SshOptions(port=2222, identity_file="~/.ssh/id_ed25519")
    argv = remote_argv("node2", options)      # ssh ... node2 /usr/bin/python3 -m byteps.launcher.remote
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import shlex
import subprocess
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from byteps.launcher.job_plan import UsageError

__all__ = ["SshOptions", "remote_argv", "remote_request", "preflight", "host_problems", "forwarded_environment",
           "FORWARDED_PREFIXES"]

#: Variables of bpslaunch's own environment that remote children get (the rest of a host's environment is
#: its own login environment); ``-x NAME`` adds more.
FORWARDED_PREFIXES = ("BYTEPS_", "DMLC_", "PS_", "OMP_", "MKL_", "NCCL_", "PYTHONPATH", "PYTHONUNBUFFERED",
                      "CUDA_VISIBLE_DEVICES")
#: What a remote child is not given even when it matches a prefix: paths that only exist here.
NOT_FORWARDED = ("BYTEPS_REPORT_DIR",)


@dataclasses.dataclass(frozen=True)
class SshOptions:
    """How bpslaunch reaches other hosts (``--ssh-port``, ``--ssh-identity-file``, ``--ssh-option``)."""

    port: Optional[int] = None
    identity_file: Optional[str] = None
    options: Tuple[str, ...] = ()  # -o KEY=VALUE, as given
    python: str = sys.executable  # the interpreter on every host (the same path, as with Horovod)
    connect_timeout_s: int = 10

    def argv(self, host: str) -> List[str]:
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout_s}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        if self.identity_file:
            argv += ["-i", self.identity_file]
        for option in self.options:
            argv += ["-o", option]
        return argv + [host]


def remote_argv(host: str, options: SshOptions) -> List[str]:
    """The ssh command line that runs :mod:`byteps.launcher.remote` on ``host``."""
    return options.argv(host) + [shlex.quote(options.python), "-m", "byteps.launcher.remote"]


def remote_request(argv: Sequence[str], env: Mapping[str, str]) -> bytes:
    """The line written to the remote end's standard input: what to run, with which variables."""
    return (json.dumps({"argv": list(argv), "env": dict(env)}) + "\n").encode()


def forwarded_environment(environ: Mapping[str, str], extra: Sequence[str] = ()) -> Dict[str, str]:
    """The part of ``environ`` remote children get: FORWARDED_PREFIXES, plus ``-x NAME`` or ``-x NAME=VALUE``."""
    out = {k: v for k, v in environ.items() if k.startswith(FORWARDED_PREFIXES) and k not in NOT_FORWARDED}
    for item in extra:
        name, equals, value = item.partition("=")
        if equals:
            out[name] = value
        elif name in environ:
            out[name] = environ[name]
        else:
            raise UsageError(f"-x {name}: not set in bpslaunch's environment (or give -x {name}=VALUE)")
    return out


def _ask(host: str, options: SshOptions, timeout_s: float) -> Tuple[str, Optional[str], str]:
    probe = "import byteps.launcher as l; from byteps.common.interface import distribution_version as v; " \
            "print('BYTEPS', v('byteps-launcher'))"
    try:
        done = subprocess.run(options.argv(host) + [shlex.quote(options.python), "-c", shlex.quote(probe)],
                              capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return host, None, f"no answer within {timeout_s:.0f} s"
    except OSError as exc:  # no ssh client on this machine
        return host, None, f"ssh cannot be run here: {exc.strerror} (install an OpenSSH client)"
    for line in done.stdout.splitlines():
        if line.startswith("BYTEPS "):
            return host, line.split(" ", 1)[1].strip(), ""
    return host, None, (done.stderr.strip().splitlines() or [f"ssh exited with code {done.returncode}"])[-1]


def host_problems(hosts: Sequence[str], options: SshOptions, expected_version: str,
                  timeout_s: float = 20.0) -> Dict[str, str]:
    """Ask every host, in parallel, for its byteps-launcher; ``{host: what is wrong}`` for each that fails."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        answers = list(pool.map(lambda host: _ask(host, options, timeout_s), hosts))
    problems = {}
    for host, version, error in answers:
        if version is None and ("No module named" in error or "ModuleNotFoundError" in error):
            problems[host] = (f"byteps-launcher is not installed for {options.python} there "
                              f"(pip install byteps-launcher=={expected_version} on every host)")
        elif version is None:
            problems[host] = (f"cannot run {options.python} over ssh: {error} (check that `ssh {host}` works "
                              "without a password: --ssh-port, --ssh-identity-file, --ssh-option)")
        elif version != expected_version:
            problems[host] = (f"has byteps-launcher {version}, this host {expected_version}: install the same "
                              "version everywhere")
    return problems


def preflight(hosts: Sequence[str], options: SshOptions, expected_version: str, timeout_s: float = 20.0) -> None:
    """Check every host answers over ssh and has this byteps-launcher; UsageError naming each that does not."""
    problems = host_problems(hosts, options, expected_version, timeout_s)
    if problems:
        raise UsageError("; ".join(f"{host}: {why}" for host, why in problems.items()))
