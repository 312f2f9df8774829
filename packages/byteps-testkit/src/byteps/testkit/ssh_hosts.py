"""Hosts to ssh into, for the launcher's tests: one real ``sshd`` per loopback address.

Each simulated host is an address of 127.0.0.0/8 (127.0.0.2, 127.0.0.3, ...)
with an OpenSSH server of its own (Debian's ``openssh-server``; the test
session installs it), listening on a free port there, with a host key and
an authorized client key generated for the test in its folder. The
processes the job starts on a "host" run on this machine, so a test can
check that none is left. Every sshd is stopped by its pid when the
context ends, whatever happened.

Example::

    with SshHosts(tmp_path, ["127.0.0.2", "127.0.0.3"]) as hosts:
        subprocess.run(["bpslaunch", "-H", "127.0.0.2:2,127.0.0.3:2", *hosts.launcher_args(), "--", ...])
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from typing import List, Sequence

from byteps.testkit.ports import free_port
from byteps.testkit.processes import stop_group

__all__ = ["SshHosts", "SSHD", "sshd_available"]

SSHD = "/usr/sbin/sshd"


def sshd_available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh") is not None and shutil.which("ssh-keygen") is not None


class SshHosts:
    """``sshd`` on each address; :meth:`launcher_args` are the bpslaunch options that reach them."""

    def __init__(self, folder: str, addresses: Sequence[str]) -> None:
        self.folder = os.path.abspath(str(folder))
        self.addresses = list(addresses)
        self.port = 0
        self.key = os.path.join(self.folder, "client_key")
        self._servers: List[subprocess.Popen] = []

    def __enter__(self) -> SshHosts:
        os.makedirs(self.folder, exist_ok=True)
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        host_key = os.path.join(self.folder, "host_key")
        for path in (self.key, host_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
        authorized = os.path.join(self.folder, "authorized_keys")
        shutil.copy(self.key + ".pub", authorized)
        # One port for every host, as a real cluster has: free on each address.
        self.port = free_port(self.addresses[0])
        try:
            for address in self.addresses:
                config = os.path.join(self.folder, f"sshd_{address}.conf")
                with open(config, "w") as f:
                    f.write(f"ListenAddress {address}:{self.port}\nHostKey {host_key}\n"
                            f"PidFile {self.folder}/sshd_{address}.pid\nAuthorizedKeysFile {authorized}\n"
                            "PermitRootLogin yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                            "UsePAM no\nStrictModes no\nLogLevel ERROR\nMaxStartups 100\nMaxSessions 100\n")
                with open(os.path.join(self.folder, f"sshd_{address}.log"), "ab") as log:
                    self._servers.append(subprocess.Popen([SSHD, "-D", "-e", "-f", config], stdin=subprocess.DEVNULL,
                                                          stdout=log, stderr=log, start_new_session=True))
            for address in self.addresses:
                self._wait_listening(address)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_listening(self, address: str, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection((address, self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {address}:{self.port} did not start") from None
                time.sleep(0.05)

    def ssh_options(self) -> List[str]:
        return ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"]

    def launcher_args(self) -> List[str]:
        args = ["--ssh-port", str(self.port), "--ssh-identity-file", self.key]
        for option in self.ssh_options():
            args += ["--ssh-option", option]
        return args

    def __exit__(self, *exc_info) -> None:
        for server in self._servers:
            stop_group(server)
        self._servers.clear()
