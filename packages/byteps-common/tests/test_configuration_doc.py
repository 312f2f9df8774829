"""docs/configuration.md against byteps.common.config: the same variables, with the same defaults.

The page's variable tables (a header row ``| variable | default | ...``) must list exactly the
variables ``Config.from_env`` reads (``ENV_DEFAULTS``), each with the default the code applies;
any other ``DMLC_``/``BYTEPS_``/``PS_``/``HOROVOD_`` name in its text must be one that
:data:`READ_ELSEWHERE` says who sets or reads; and a variable any package reads straight from an
environment must be on the page. The tests read the doc from the source tree (the repository
root, found from this file) and the code from the installed wheel.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Mapping
from typing import Dict, Iterator, Set

from byteps.common.config import ENV_DEFAULTS, Config

ROOT = pathlib.Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "configuration.md"
NAME = re.compile(r"\b(?:DMLC|BYTEPS|PS|HOROVOD)_[A-Z0-9_]*[A-Z0-9]\b")
NO_DEFAULT = "–"

#: Names the page mentions that Config does not read, with the file that sets or reads each one.
READ_ELSEWHERE = {
    # Horovod's rank variables: bpslaunch sets them for the training script, byteps never reads them.
    "HOROVOD_RANK": "packages/byteps-launcher/src/byteps/launcher/job_plan.py",
    "HOROVOD_SIZE": "packages/byteps-launcher/src/byteps/launcher/job_plan.py",
    "HOROVOD_LOCAL_RANK": "packages/byteps-launcher/src/byteps/launcher/job_plan.py",
    "HOROVOD_LOCAL_SIZE": "packages/byteps-launcher/src/byteps/launcher/job_plan.py",
    "HOROVOD_CROSS_RANK": "packages/byteps-launcher/src/byteps/launcher/job_plan.py",
    "HOROVOD_CROSS_SIZE": "packages/byteps-launcher/src/byteps/launcher/job_plan.py",
    # Elastic jobs: bpslaunch's epoch folder and the worker's lasting name, read before any Config exists.
    "BYTEPS_ELASTIC_DIR": "packages/byteps-common/src/byteps/common/elastic/membership.py",
    "BYTEPS_ELASTIC_WORKER": "packages/byteps-common/src/byteps/common/elastic/membership.py",
    "BYTEPS_ELASTIC_RENDEZVOUS": "packages/byteps-common/src/byteps/common/elastic/membership.py",
    "BYTEPS_ELASTIC_KEY": "packages/byteps-common/src/byteps/common/elastic/membership.py",
    "BYTEPS_LOST_NODE_FILE": "packages/byteps-server/src/byteps/server/cli.py",
    # Elastic jobs' server-held tables: where a commit has the servers save them (read at the commit).
    "BYTEPS_HELD_TABLE_DIR": "packages/byteps-common/src/byteps/common/elastic/held_tables.py",
}

# A read of one of our variables from an environment mapping: environ.get("X"), env["X"], getenv("X").
DIRECT_READ = re.compile(
    r"""(?:\b(?:environ|env)\s*(?:\.get\(|\[)|\bgetenv\()\s*["']((?:DMLC|BYTEPS|PS|HOROVOD)_\w+)["']""")


def documented_defaults(text: str) -> Dict[str, str]:
    """``{variable: default cell}`` of every variable table in ``text``."""
    rows: Dict[str, str] = {}
    in_table = False
    for line in text.splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[:2] == ["variable", "default"]:
            in_table = True
        elif in_table and not set(cells[0]) <= set("-: "):
            name = cells[0].strip("`")
            assert name not in rows, f"{name} is listed twice in {DOC}"
            rows[name] = cells[1]
    return rows


def agrees(cell: str, code: object) -> bool:
    """Whether a default cell (its value before any " (...)" note) says what the code applies."""
    value = cell.split(" (", 1)[0].strip().strip("`")
    if code is None or code == ():
        return value == NO_DEFAULT
    if isinstance(code, bool):
        return value == str(int(code))
    if isinstance(code, (int, float)):
        try:
            return float(value) == code
        except ValueError:
            return False
    return value == code


class RecordingEnviron(Mapping):
    """An environment that remembers every variable asked for."""

    def __init__(self, values: Dict[str, str]) -> None:
        self.values = values
        self.asked: Set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.asked.add(name)
        return self.values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def test_the_tables_list_every_variable_config_reads_and_nothing_else():
    documented = set(documented_defaults(DOC.read_text()))
    assert documented == set(ENV_DEFAULTS), (
        f"{DOC}: missing {sorted(set(ENV_DEFAULTS) - documented)}; "
        f"not read by Config: {sorted(documented - set(ENV_DEFAULTS))}")


def test_documented_defaults_are_the_code_defaults():
    documented = documented_defaults(DOC.read_text())
    wrong = [f"{name}: doc {documented[name]!r}, code {code!r}"
             for name, code in ENV_DEFAULTS.items() if name in documented and not agrees(documented[name], code)]
    assert not wrong, f"{DOC} disagrees with ENV_DEFAULTS: " + "; ".join(wrong)


def test_from_env_reads_exactly_the_variables_of_env_defaults():
    distributed = {"DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9000", "DMLC_NUM_SERVER": "2"}
    asked: Set[str] = set()
    for values in ({}, {**distributed, "DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "1"},
                   {**distributed, "DMLC_ROLE": "server"}):
        environ = RecordingEnviron(values)
        Config.from_env(environ)
        asked |= environ.asked
    assert asked == set(ENV_DEFAULTS), (
        f"read but not in ENV_DEFAULTS: {sorted(asked - set(ENV_DEFAULTS))}; "
        f"in ENV_DEFAULTS but never read: {sorted(set(ENV_DEFAULTS) - asked)}")


def test_a_default_config_is_what_from_env_applies():
    assert Config() == Config.from_env({})


def test_other_names_on_the_page_are_set_or_read_where_it_says():
    others = set(NAME.findall(DOC.read_text())) - set(ENV_DEFAULTS)
    assert others <= set(READ_ELSEWHERE), f"{DOC} names {sorted(others - set(READ_ELSEWHERE))}, which nothing reads"
    for name, path in READ_ELSEWHERE.items():
        assert name in (ROOT / path).read_text(), f"READ_ELSEWHERE: {path} no longer mentions {name}"


def test_variables_packages_read_directly_are_documented():
    sources = [path for pattern in ("packages/*/src/**/*.py", "packages/*/csrc/**/*") for path in ROOT.glob(pattern)
               if path.is_file()]
    assert sources, f"no package sources under {ROOT}"
    read = {name: path for path in sources for name in DIRECT_READ.findall(path.read_text(errors="replace"))}
    documented = set(NAME.findall(DOC.read_text()))
    missing = {name: str(path.relative_to(ROOT)) for name, path in read.items() if name not in documented}
    assert not missing, f"read from the environment but not in {DOC}: {missing}"
