"""Check that every figure in docs/performance.md names the command that makes it.

The rule (also stated at the top of the page):

* The page is cut into sections at its headings (``#`` lines outside code).
* An *item* is a table row, a bullet with its indented continuation lines,
  or a paragraph, outside fenced code. A *figure* is a number followed by
  one of the units in ``UNITS`` (``1.80 s``, ``44 ms``, ``2.2 GB/s``,
  ``1.42x``, ``90%``, ``536 img/s``, ``8,500 partitions/s``, ...) outside
  backticks.
* A *command* is a backticked span or a line of a fenced code block that
  starts (after ``sudo`` and ``NAME=value`` settings) with
  ``python benchmarks/``, ``python examples/``, ``nox -s ``, ``bpslaunch ``
  or a path to a ``benchmarks/...sh`` script. Indented code does not count.
* Every item holding a figure must sit in a section that holds a command,
  or link to a section of the same page that does (``[...](#anchor)``).
* The page has at most ``MAX_LINES`` lines.

    python benchmarks/check_performance_reference.py [path]    # default: docs/performance.md

Exit status 1, naming each offending line (an item's first line with a
figure), when the page breaks a rule.
"""

from __future__ import annotations

import os
import re
import sys

MAX_LINES = 300
UNITS = r"(?:ms|µs|us|s|GB/s|MB/s|img/s|partitions/s|/s|x|%)"
FIGURE = re.compile(r"\d(?:[\d,.]*\d)?\s?" + UNITS + r"(?![\w/])")
COMMAND = re.compile(r"^(?:sudo\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
                     r"(?:python3?\s+(?:benchmarks|examples)/|nox\s+-s\s|bpslaunch\s|\S*benchmarks/\S*\.sh\b)")
CODE_SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\]\(#([^)\s]+)\)")
DEFAULT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "docs",
                                       "performance.md"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def check(lines: list) -> list:
    sections = {"": False}    # anchor -> holds a command; "" is the text before the first heading
    items = []                # [first figure's line number, its text, section anchor, the item's text]
    section, fenced, item = "", False, None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```") or fenced:
            fenced ^= stripped.startswith("```")
            sections[section] |= bool(COMMAND.match(stripped))
            item = None
            continue
        if not stripped or stripped.startswith("#"):
            if stripped:
                section = slug(stripped.lstrip("#"))
                sections.setdefault(section, False)
            item = None
            continue
        if any(COMMAND.match(span.strip()) for span in CODE_SPAN.findall(line)):
            sections[section] = True
        if item is None or stripped.startswith(("|", "- ", "* ")) or item[3].startswith("|"):
            item = [None, "", section, ""]
            items.append(item)
        item[3] += line + "\n"
        if item[0] is None and FIGURE.search(CODE_SPAN.sub("", line)):
            item[0], item[1] = number, stripped
    errors = [f"line {number}: a figure in a section with no command, linking to none: {text[:100]}"
              for number, text, where, body in items
              if number and not sections[where] and not any(sections.get(a) for a in LINK.findall(body))]
    if len(lines) > MAX_LINES:
        errors.append(f"the page has {len(lines)} lines; a reference holds at most {MAX_LINES}")
    return errors


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    with open(path, encoding="utf-8") as f:
        errors = check(f.read().splitlines())
    for error in errors:
        print(f"{path}: {error}", file=sys.stderr)
    if errors:
        print(f"{path}: every figure must name its command (python benchmarks/check_performance_reference.py "
              "--help has the rule)", file=sys.stderr)
        return 1
    print(f"{path}: every figure names its command")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    sys.exit(main())
