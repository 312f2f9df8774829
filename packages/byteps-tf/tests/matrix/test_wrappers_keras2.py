"""The gradient wrappers' 3-rank job (tests/test_wrappers.py) under Keras 2 (``TF_USE_LEGACY_KERAS=1``: its
optimizer wrapper is another class). Kept out of the default run for CI time; Keras 2's wrappers run there in
test_jobs.py's keras2 jobs."""

from __future__ import annotations

from test_wrappers import wrappers_under_bpslaunch


def test_wrappers_under_bpslaunch_with_keras_2():
    wrappers_under_bpslaunch({"TF_USE_LEGACY_KERAS": "1"})
