"""``op=Adasum`` in the gradient wrappers with Keras 2 as ``tf.keras`` (``TF_USE_LEGACY_KERAS=1``): the default
run's test_adasum.py job, whose Keras 3 form runs by default."""

from __future__ import annotations

from test_adasum import check_adasum_wrappers


def test_adasum_wrappers_under_keras2():
    check_adasum_wrappers("keras2")
