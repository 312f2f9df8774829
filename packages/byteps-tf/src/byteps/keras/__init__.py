"""byteps.keras: the same module as byteps.tensorflow.keras (Keras runs on TensorFlow here).

Horovod has ``horovod.keras`` next to ``horovod.tensorflow.keras``; with
Keras on TensorFlow (Keras 3, or Keras 2 with TF_USE_LEGACY_KERAS=1) they
are one thing, so both byteps names give the same API::

    import byteps.keras as bps      # was: import horovod.keras as hvd
"""

from byteps.tensorflow.keras import *  # noqa: F403  (callbacks included)
from byteps.tensorflow.keras import __all__  # noqa: F401
