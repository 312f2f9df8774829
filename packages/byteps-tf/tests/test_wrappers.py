"""The gradient wrappers in a real 3-rank job: process sets, the TF1 optimizer's backward passes, scale factors,
op=Adasum's refusal of 3 ranks and Adasum over a process set of 2.

Runs scripts/wrapper_checks.py under the real bpslaunch (``-np 3``) with
Keras 3; every rank checks its results against numpy computed from every
rank's inputs. The same job under Keras 2 (``TF_USE_LEGACY_KERAS=1``, whose
optimizer wrapper is another class) is matrix/test_wrappers_keras2.py.
"""

from __future__ import annotations

from tf_jobs import SCRIPTS, launch_tf_job

from byteps.testkit import assert_all_ok


def wrappers_under_bpslaunch(env=None):
    result = launch_tf_job(["-np", "3"], f"{SCRIPTS}/wrapper_checks.py", env=env, timeout=300)
    assert_all_ok(result, checks=8, ranks=3)


def test_wrappers_under_bpslaunch():
    wrappers_under_bpslaunch()
