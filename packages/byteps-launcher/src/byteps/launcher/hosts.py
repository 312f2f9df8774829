"""Host lists in Horovod's syntax: ``-H host1:2,host2:2`` and hostfiles.

A host is a name or address and its slots: how many worker processes it
runs (``host`` alone means 1 slot). A hostfile has one host per line, as
``host:slots`` or ``host slots=N`` (OpenMPI's form, which Horovod reads
too); blank lines and ``#`` comments are skipped. Every mistake is a
:class:`~byteps.launcher.job_plan.UsageError` naming the entry and the fix.

Example::

    parse_hosts("10.0.0.1:2,10.0.0.2:2")
    # [Host(name='10.0.0.1', slots=2), Host(name='10.0.0.2', slots=2)]
"""

from __future__ import annotations

import dataclasses
import re
import socket
from typing import Iterable, List

from byteps.launcher.job_plan import UsageError

__all__ = ["Host", "parse_hosts", "read_hostfile", "parse_host_lines", "parse_host_names", "is_local"]

_NAME = re.compile(r"[A-Za-z0-9_.\-\[\]:]+")


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int = 1


def _entry(text: str, where: str) -> Host:
    entry = text.strip()
    name, slots_text = entry, "1"
    match = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\S+)", entry)
    if match:
        name, slots_text = match.groups()
    elif entry.count(":") == 1:
        name, slots_text = entry.split(":")
    if not name or not _NAME.fullmatch(name):
        raise UsageError(f"{where}: {text.strip()!r} is not a host; write host:slots, e.g. node1:2")
    try:
        slots = int(slots_text)
    except ValueError:
        raise UsageError(f"{where}: {text.strip()!r}: slots must be a whole number, e.g. {name}:2") from None
    if slots < 1:
        raise UsageError(f"{where}: {text.strip()!r} has {slots} slots; a host needs at least 1 (or leave it out)")
    return Host(name, slots)


def _checked(hosts: List[Host], where: str) -> List[Host]:
    if not hosts:
        raise UsageError(f"{where} names no host")
    seen = set()
    for host in hosts:
        if host.name in seen:
            raise UsageError(f"{where} names {host.name} twice; give each host once with all its slots")
        seen.add(host.name)
    return hosts


def parse_hosts(text: str) -> List[Host]:
    """``-H host1:2,host2:2``."""
    return _checked([_entry(item, "-H") for item in text.split(",")], "-H")


def read_hostfile(path: str) -> List[Host]:
    """``--hostfile FILE``: one ``host:slots`` or ``host slots=N`` per line."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UsageError(f"--hostfile {path}: {exc.strerror}") from None
    return parse_host_lines(lines, f"--hostfile {path}")


def parse_host_lines(lines: Iterable[str], where: str) -> List[Host]:
    """Hosts from a hostfile's lines (blank lines and ``#`` comments skipped); ``where`` names the source
    in errors, e.g. ``--hostfile hosts.txt`` or a discovery script's output."""
    hosts = []
    for number, line in enumerate(lines, start=1):
        content = line.split("#", 1)[0]
        if content.strip():
            hosts.append(_entry(content, f"{where} line {number}"))
    return _checked(hosts, where)


def parse_host_names(text: str, flag: str) -> List[str]:
    """``--server-hosts h3,h4``: names only."""
    names = [item.strip() for item in text.split(",")]
    if not all(names) or not all(_NAME.fullmatch(n) for n in names):
        raise UsageError(f"{flag} {text!r}: expected host names separated by commas, e.g. cpu1,cpu2")
    if len(set(names)) != len(names):
        raise UsageError(f"{flag} {text!r} names a host twice")
    return names


def is_local(name: str) -> bool:
    """Whether ``name`` is this machine itself (started without ssh): localhost or this host's name."""
    return name in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())
