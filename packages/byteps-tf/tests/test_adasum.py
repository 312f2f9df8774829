"""``op=Adasum`` in the gradient wrappers, in a real 2-rank job (Horovod's semantics; docs in gradients.py).

Runs scripts/adasum_checks.py under the real bpslaunch with one server,
with Keras 3 (matrix/test_adasum_keras2.py runs it with Keras 2,
``TF_USE_LEGACY_KERAS=1``, whose optimizer wrapper is another class, under
``nox -t matrix``); every rank checks its results against
numpy's Adasum of every rank's gradients (the tape and the Keras
optimizer) or changes (the TF1 delta optimizer). The refusal of a
non-power-of-two number of ranks and Adasum over a process set are checked
in the 3-rank job of test_wrappers.py.
"""

from __future__ import annotations

from tf_jobs import SCRIPTS, launch_tf_job

from byteps.testkit import assert_all_ok, rank_lines

KERAS = {"keras3": {}, "keras2": {"TF_USE_LEGACY_KERAS": "1"}}


def check_adasum_wrappers(keras: str) -> None:
    result = launch_tf_job(["--workers", "2", "--servers", "1"], f"{SCRIPTS}/adasum_checks.py", env=KERAS[keras],
                           timeout=300)
    assert_all_ok(result, checks=5)
    assert f"KERAS {'2' if keras == 'keras2' else '3'}" in rank_lines(result.stdout, 0)


def test_adasum_wrappers_under_bpslaunch():
    check_adasum_wrappers("keras3")
