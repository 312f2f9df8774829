"""Which Keras byteps works with: the one ``tf.keras`` names.

TensorFlow 2.16 and later make ``tf.keras`` Keras 3, or Keras 2 (the
``tf_keras`` package) when ``TF_USE_LEGACY_KERAS`` is ``1``/``true``. Scripts
written for Keras 2 (most Horovod scripts: ``tf.keras.optimizers.legacy``,
``model.compile(experimental_run_tf_function=...)``, an optimizer's
``lr``) run on a recent TensorFlow that way, and byteps follows the same
switch, so a script's models, optimizers, callbacks and byteps' wrappers of
them all come from one Keras::

    $ pip install tf-keras==2.21.*          # the release of TensorFlow's
    $ TF_USE_LEGACY_KERAS=1 bpslaunch -np 2 -- python train_keras2.py

``keras`` is that module (``keras`` or ``tf_keras``) and ``KERAS2`` says
which. Anything wrong (the switch set without tf_keras, Keras 2 installed
as ``keras`` without the switch) is an ImportError that says what to
install or set.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Tuple

from byteps.common.frontend.versions import version_tuple

__all__ = ["KERAS2", "keras", "keras2_requested"]

#: TF_USE_LEGACY_KERAS values that make tf.keras Keras 2 (TensorFlow's own test).
_LEGACY_VALUES = ("1", "true", "True")


def keras2_requested() -> bool:
    """Whether TF_USE_LEGACY_KERAS asks for Keras 2, as TensorFlow reads it."""
    return os.environ.get("TF_USE_LEGACY_KERAS") in _LEGACY_VALUES


def _choose() -> Tuple[ModuleType, bool]:
    if keras2_requested():
        try:
            import tf_keras
        except ImportError as exc:
            raise ImportError("TF_USE_LEGACY_KERAS=1 asks for Keras 2, the tf_keras package, which is not "
                              "installed: pip install 'tf-keras==<your TensorFlow's version>.*', or unset "
                              "TF_USE_LEGACY_KERAS for Keras 3") from exc
        return tf_keras, True
    try:
        import keras
    except ImportError as exc:
        raise ImportError("byteps' Keras support needs Keras 3 (pip install 'keras>=3'), or Keras 2 with "
                          "TF_USE_LEGACY_KERAS=1 and tf-keras installed") from exc
    version = getattr(keras, "__version__", "0.0")
    if version_tuple(version) < (3, 0):
        raise ImportError(f"keras {version} is installed as 'keras': byteps takes Keras 3 from 'keras' "
                          "(pip install --upgrade 'keras>=3'), or Keras 2 from tf-keras with TF_USE_LEGACY_KERAS=1")
    return keras, False


keras, KERAS2 = _choose()
