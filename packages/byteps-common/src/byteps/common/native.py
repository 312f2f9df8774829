"""Where byteps-common's C++ headers are, for extensions that build on them.

The framework adapters and byteps-server read DLPack tensors and buffer
arguments through one header-only C++ API shipped with byteps-common
(``byteps/dlpack.h``, ``byteps/dlpack_capsule.h``, ``byteps/buffer_arg.h``).
A build outside the monorepo finds it the way it finds numpy's::

    import byteps.common
    include_dirs = [byteps.common.get_include()]   # then #include "byteps/dlpack.h"
"""

from __future__ import annotations

from pathlib import Path

_HEADER = Path("byteps") / "dlpack.h"


def get_include() -> str:
    """The directory holding ``byteps/*.h``: inside the installed wheel, or ``csrc/include``
    of the source tree when byteps-common is imported from a clone (``src/`` on the path).

    >>> import os, byteps.common
    >>> os.path.isfile(os.path.join(byteps.common.get_include(), "byteps", "dlpack.h"))
    True
    """
    here = Path(__file__).resolve().parent
    candidates = (here / "include", here.parents[2] / "csrc" / "include")
    for candidate in candidates:
        if (candidate / _HEADER).is_file():
            return str(candidate)
    raise FileNotFoundError(f"byteps-common's C++ headers are missing: looked for {_HEADER} in "
                            f"{', '.join(str(c) for c in candidates)}; reinstall byteps-common")


def get_cmake_dir() -> str:
    """The directory holding ``FindBytepsCommon.cmake``, for ``CMAKE_MODULE_PATH`` in builds outside the monorepo."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "cmake", here.parents[2] / "cmake"):
        if (candidate / "FindBytepsCommon.cmake").is_file():
            return str(candidate)
    raise FileNotFoundError("byteps-common's FindBytepsCommon.cmake is missing; reinstall byteps-common")
