"""Check that docs/horovod-compatibility.md lists every ``raise NotImplementedError(...)`` in the packages.

The rule (the page's "Refusals" section says it too):

* A *raise site* is an ``ast.Raise`` in ``packages/*/src/**/*.py`` whose
  exception is a call of the name ``NotImplementedError``. Its *text* is the
  statement's source (``ast.get_source_segment``); a fragment also matches
  when it lies across the pieces of an implicitly concatenated string.
* A *row* is a line of the table under ``## Refusals``: the file (path
  relative to ``packages/``, in backticks), a fragment of the message (in
  backticks), and why.
* Every raise site is matched by exactly one row (same file, fragment in its
  text), and every row matches exactly one raise site.
* In the table under ``## Capability matrix``, a cell that starts with
  ``refused`` names what refuses in backticks: every backticked span of such
  a cell must appear in the source of some ``raise`` statement of the
  packages (any exception class: the refusals there are ValueErrors,
  RuntimeErrors and NotImplementedErrors).

    python benchmarks/check_refusals.py [page]    # default: docs/horovod-compatibility.md

Exit status 1, naming each problem, when the page and the sources disagree.
Standard library only (Python 3.9+).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ROOT / "packages"
DEFAULT = ROOT / "docs" / "horovod-compatibility.md"
CODE_SPAN = re.compile(r"`([^`]+)`")


class RaiseSite(NamedTuple):
    file: str    # relative to packages/
    line: int
    text: str    # the statement's source
    joined: str  # its string literals' pieces, concatenated (f-string fields as {...} are left out)


class Row(NamedTuple):
    line: int
    file: str
    fragment: str


def _literal_text(node: ast.AST) -> str:
    """The literal pieces of every string in ``node``, in order, each string's pieces joined."""
    pieces = []
    for child in ast.walk(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            pieces.append(child.value)
    return "".join(pieces)


def _is_not_implemented(node: ast.Raise) -> bool:
    exc = node.exc
    return isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.func.id == "NotImplementedError"


def raise_statements(packages: Path = PACKAGES) -> Iterator[Tuple[RaiseSite, bool]]:
    """Every raise statement of packages/*/src/**/*.py, and whether it raises NotImplementedError(...)."""
    for path in sorted(packages.glob("*/src/**/*.py")):
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                text = ast.get_source_segment(source, node) or ""
                site = RaiseSite(path.relative_to(packages).as_posix(), node.lineno, text, _literal_text(node.exc))
                yield site, _is_not_implemented(node)


def section_table(lines: List[str], heading: str) -> List[Tuple[int, List[str]]]:
    """The cells of every table row under ``## heading`` (header and separator rows left out), by line number."""
    rows, inside, fenced = [], False, False
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if stripped.startswith("## "):
            inside = stripped[3:].strip() == heading
            continue
        if inside and stripped.startswith("|"):
            cells = [cell.strip() for cell in stripped.strip("|").split("|")]
            if all(re.fullmatch(r":?-+:?", cell) for cell in cells):
                continue
            rows.append((number, cells))
    # the first row of each table is its header: drop rows followed by a separator line
    return [(number, cells) for number, cells in rows
            if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[number].strip() if number < len(lines) else "")]


def refusal_rows(lines: List[str]) -> Tuple[List[Row], List[str]]:
    rows, problems = [], []
    for number, cells in section_table(lines, "Refusals"):
        spans = [CODE_SPAN.findall(cell) for cell in cells[:2]]
        if len(cells) < 3 or len(spans[0]) != 1 or len(spans[1]) != 1:
            problems.append(f"line {number}: a Refusals row needs `file`, `fragment` and why, got {cells}")
            continue
        rows.append(Row(number, spans[0][0], spans[1][0]))
    return rows, problems


def _matches(row: Row, site: RaiseSite) -> bool:
    return row.file == site.file and (row.fragment in site.text or row.fragment in site.joined)


def check(lines: List[str], packages: Path = PACKAGES) -> List[str]:
    statements = list(raise_statements(packages))
    sites = [site for site, not_implemented in statements if not_implemented]
    rows, problems = refusal_rows(lines)
    if not any(line.strip() == "## Refusals" for line in lines):
        problems.append("the page has no '## Refusals' section")
    matched_by: Dict[RaiseSite, List[Row]] = {site: [] for site in sites}
    for row in rows:
        found = [site for site in sites if _matches(row, site)]
        if not found:
            problems.append(f"line {row.line}: no raise NotImplementedError(...) in packages/{row.file} contains "
                            f"{row.fragment!r}")
        elif len(found) > 1:
            where = ", ".join(f"line {site.line}" for site in found)
            problems.append(f"line {row.line}: {row.fragment!r} matches several raises in packages/{row.file} "
                            f"({where}): quote more of the one meant")
        for site in found:
            matched_by[site].append(row)
    for site, matching in matched_by.items():
        if not matching:
            first = site.text.splitlines()[0].strip()
            problems.append(f"packages/{site.file}:{site.line}: {first} ... has no row in the Refusals table")
        elif len(matching) > 1:
            where = ", ".join(f"line {row.line}" for row in matching)
            problems.append(f"packages/{site.file}:{site.line}: matched by several Refusals rows ({where})")
    problems.extend(check_matrix(lines, [site for site, _ in statements]))
    return problems


def check_matrix(lines: List[str], every_raise: List[RaiseSite]) -> List[str]:
    """Each backticked span of a 'refused' cell of the capability matrix lies in some raise statement."""
    problems = []
    for number, cells in section_table(lines, "Capability matrix"):
        for cell in cells:
            if not cell.lower().startswith("refused"):
                continue
            for fragment in CODE_SPAN.findall(cell):
                if not any(fragment in site.text or fragment in site.joined for site in every_raise):
                    problems.append(f"line {number}: the refused cell's {fragment!r} is in no raise statement of "
                                    "packages/*/src")
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    page = Path(args[0]) if args else DEFAULT
    lines = page.read_text(encoding="utf-8").splitlines()
    problems = check(lines)
    for problem in problems:
        print(f"{page}: {problem}", file=sys.stderr)
    if problems:
        print(f"{page}: {len(problems)} problem(s): the Refusals table must list every raise NotImplementedError(...) "
              "of packages/*/src, one row each (benchmarks/check_refusals.py)", file=sys.stderr)
        return 1
    sites = sum(1 for _, not_implemented in raise_statements() if not_implemented)
    print(f"{page}: {sites} NotImplementedError raises, each with its row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
