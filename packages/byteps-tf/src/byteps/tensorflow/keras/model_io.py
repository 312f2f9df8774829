"""load_model: a saved Keras model whose optimizer comes back as a DistributedOptimizer.

Example::

    model = bps.load_model("checkpoint.keras")     # optimizer state restored, gradients averaged

Every Keras optimizer class in ``keras.optimizers`` (and each class in
``custom_optimizers``) is replaced, while loading, by a stand-in whose
``from_config`` builds the optimizer and wraps it with
:func:`~byteps.tensorflow.keras.DistributedOptimizer`; ``custom_objects``
entries take precedence, as in Horovod.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

from byteps.tensorflow.compression import Compression
from byteps.tensorflow.keras.optimizer import DistributedOptimizer
from byteps.tensorflow.which_keras import keras

__all__ = ["load_model"]


def _builtin_optimizers() -> Iterable[type]:
    # Keras 2 keeps its LossScaleOptimizer in keras.mixed_precision (and its legacy optimizers apart: not here).
    excluded = (keras.optimizers.Optimizer, getattr(keras.optimizers, "LossScaleOptimizer", None))
    for value in vars(keras.optimizers).values():
        if isinstance(value, type) and issubclass(value, keras.optimizers.Optimizer) and value not in excluded:
            yield value


def _loader(base: type, options: Dict[str, Any]) -> type:
    """A stand-in class for ``base`` whose from_config returns a distributed ``base`` (with ``options``)."""

    def from_config(cls: type, config: Dict[str, Any], custom_objects: Optional[Dict[str, Any]] = None) -> Any:
        return DistributedOptimizer(base.from_config(config, custom_objects=custom_objects), **options)

    return type(base.__name__, (base,), {"from_config": classmethod(from_config), "__module__": base.__module__})


def load_model(filepath: Any, custom_optimizers: Optional[Iterable[type]] = None,
               custom_objects: Optional[Dict[str, Any]] = None, compression: Any = Compression.none, *,
               backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False) -> Any:
    """``keras.models.load_model`` with the optimizer wrapped in a DistributedOptimizer (Horovod's signature).

    ``backward_passes_per_step`` and ``average_aggregated_gradients`` (not
    in Horovod's signature) resume accumulating training: the saved
    optimizer state is the same with any number of passes, so a model saved
    with N passes loads with N (or with 1, Horovod's only choice).
    """
    options = {"compression": compression, "backward_passes_per_step": backward_passes_per_step,
               "average_aggregated_gradients": average_aggregated_gradients}
    objects: Dict[str, Any] = {}
    for cls in [*_builtin_optimizers(), *(custom_optimizers or [])]:
        objects[keras.saving.get_registered_name(cls)] = _loader(cls, options)
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects)
