"""The environment a test gives the processes it starts: this one, minus byteps' own knobs."""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence

__all__ = ["BYTEPS_PREFIXES", "clean_env", "unset_byteps_env", "one_process_adapter"]

#: Prefixes of the variables byteps reads (BytePS's and ps-lite's).
BYTEPS_PREFIXES = ("DMLC_", "BYTEPS_", "PS_")


def clean_env(extra: Optional[Mapping[str, str]] = None, *, drop: Sequence[str] = ()) -> Dict[str, str]:
    """``os.environ`` without any ``DMLC_*``/``BYTEPS_*``/``PS_*`` variable (or ``drop`` prefix), plus ``extra``.

    A knob set in the shell that runs pytest must not change what a test
    checks; the test says every setting it needs in ``extra``.

    Example::

        env = clean_env({"BYTEPS_PARTITION_BYTES": "4000"}, drop=("MXNET_",))
    """
    prefixes = (*BYTEPS_PREFIXES, *drop)
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(extra or {})
    return env


def unset_byteps_env(monkeypatch: Any) -> None:
    """Remove byteps' variables from this process's environment for one test; pytest's ``monkeypatch`` restores them.

    For tests that call ``init()`` in the pytest process itself (one worker,
    no scheduler): a ``DMLC_ROLE`` left in the shell would make it wait for one.

    Example::

        def test_one_process(monkeypatch):
            unset_byteps_env(monkeypatch)
            bps.init()
    """
    for variable in list(os.environ):
        if variable.startswith(BYTEPS_PREFIXES):
            monkeypatch.delenv(variable)


@contextlib.contextmanager
def one_process_adapter(monkeypatch: Any, module: str) -> Iterator[Any]:
    """The adapter ``module`` (``byteps.torch``, ``byteps.tensorflow``, ...) initialised as one worker process,
    with no byteps variable from the environment; shut down at the end. An adapter's ``bps`` fixture::

        @pytest.fixture
        def bps(monkeypatch):
            with one_process_adapter(monkeypatch, "byteps.torch") as adapter:
                yield adapter
    """
    unset_byteps_env(monkeypatch)
    adapter = importlib.import_module(module)
    adapter.init()
    try:
        yield adapter
    finally:
        adapter.shutdown()
