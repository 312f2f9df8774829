"""byteps.keras.callbacks: the callbacks of byteps.tensorflow.keras.callbacks."""

from byteps.tensorflow.keras.callbacks import *  # noqa: F401,F403
from byteps.tensorflow.keras.callbacks import __all__  # noqa: F401
