"""An optimizer's variables and learning rate, the same way for Keras 3 and for Keras 2's two optimizer families.

Keras 3 optimizers, Keras 2's (``tf_keras.optimizers``, 2.11+) and Keras 2's
legacy ones (``tf_keras.optimizers.legacy``, OptimizerV2) each build their
state and list their variables differently; the callbacks and the elastic
state use these three functions instead of any one family's API::

    build_optimizer(model.optimizer, model.trainable_variables)   # no-op once built
    broadcast_variables(optimizer_variables(model.optimizer), root_rank=0)
    old = learning_rate(model.optimizer)
"""

from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np

__all__ = ["build_optimizer", "learning_rate", "optimizer_variables"]


def optimizer_variables(optimizer: Any) -> List[Any]:
    """The optimizer's variables (iterations, slots): a property in Keras 3 and Keras 2, a method in OptimizerV2."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def build_optimizer(optimizer: Any, variables: Sequence[Any]) -> None:
    """Create the optimizer's state for ``variables`` now, unless it exists (it then stays as it is)."""
    if hasattr(optimizer, "_create_all_weights"):   # Keras 2 legacy (OptimizerV2): slots are made idempotently
        optimizer._create_all_weights(list(variables))
    elif hasattr(optimizer, "build") and not getattr(optimizer, "built", getattr(optimizer, "_built", False)):
        optimizer.build(list(variables))


def learning_rate(optimizer: Any) -> float:
    """The optimizer's current learning rate as a float (a variable in every family)."""
    return float(np.asarray(optimizer.learning_rate))
