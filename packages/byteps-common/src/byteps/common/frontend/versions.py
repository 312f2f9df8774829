"""Framework version checks at import, with an error that says what to install.

Example::

    require_framework("byteps-torch", "torch", torch.__version__, minimum=(2, 1))
"""

from __future__ import annotations

from typing import Optional, Tuple

__all__ = ["version_tuple", "require_framework"]


def version_tuple(text: str) -> Tuple[int, ...]:
    """``"2.1.0+cpu"`` -> ``(2, 1)``: major and minor, digits only (``"2.16rc1"`` -> ``(2, 16)``)."""
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _dotted(version: Tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def require_framework(requirer: str, framework: str, installed: str, minimum: Tuple[int, ...],
                      below: Optional[Tuple[int, ...]] = None, install: Optional[str] = None) -> None:
    """ImportError unless ``minimum <= installed < below``, naming both versions and the pip command."""
    found = version_tuple(installed)
    if found >= minimum and (below is None or found < below):
        return
    if below is None:
        wanted = f"needs {framework} >= {_dotted(minimum)}"
    else:
        wanted = f"supports {framework} >= {_dotted(minimum)} and < {_dotted(below)}"
    raise ImportError(f"{requirer} {wanted}, but {framework} {installed} is installed: "
                      f"{install or f'pip install --upgrade {framework}'}")
