"""Interface versions between byteps packages.

Each byteps package publishes ``INTERFACE_VERSION = (major, minor)`` in its
``__init__``. A package that uses a sibling checks, at import, that the
sibling's major version is the one it was written for and its minor version
is at least the one it needs (the jax/jaxlib and pydantic/pydantic-core
pattern). The error names both packages, both versions and what to install,
instead of failing later with an AttributeError or a wrong result.

Example::

    from byteps.common.interface import require_interface
    require_interface("byteps-transport", "byteps.transport", (1, 0), requirer="byteps-server")
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Tuple

__all__ = ["InterfaceVersionError", "require_interface", "distribution_version"]


class InterfaceVersionError(ImportError):
    """Two installed byteps packages were built for different interfaces."""


def distribution_version(distribution: str) -> str:
    """Installed version of a distribution, or 'unknown' when run from a source tree."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def check_interface(
    provider: str, provided: Tuple[int, int], needed: Tuple[int, int], requirer: str
) -> None:
    """Raise InterfaceVersionError unless ``provided`` satisfies ``needed``."""
    if provided[0] == needed[0] and provided[1] >= needed[1]:
        return
    raise InterfaceVersionError(
        f"{requirer} {distribution_version(requirer)} needs {provider} interface "
        f"{needed[0]}.x (>= {needed[0]}.{needed[1]}), but the installed {provider} "
        f"{distribution_version(provider)} provides interface {provided[0]}.{provided[1]}. "
        f"Install matching versions, e.g. pip install --upgrade {requirer} {provider}"
    )


def require_interface(provider: str, module: str, needed: Tuple[int, int], requirer: str) -> None:
    """Import ``module`` (from distribution ``provider``) and check its interface version."""
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        raise InterfaceVersionError(
            f"{requirer} needs {provider} (module {module}), which cannot be imported: {exc}. "
            f"Install it: pip install {provider}"
        ) from exc
    provided = tuple(getattr(imported, "INTERFACE_VERSION", (0, 0)))
    check_interface(provider, provided, needed, requirer)  # type: ignore[arg-type]
