"""broadcast_parameters: every rank starts from the root's parameters.

Parameters are broadcast in the order of their names, not the order they
come in, so ranks that build or collect them in another order still agree;
each goes under the byteps name ``"<prefix>Parameter.<key>"`` (the key is a
gluon Parameter's full name), the same names DistributedTrainer broadcasts
under. A gluon Parameter whose shape is not known yet (deferred
initialisation) is broadcast right after it is initialised, in the first
forward pass, which every rank runs in the same order.

Example::

    net.initialize()
    bps.broadcast_parameters(net.collect_params(), root_rank=0)
    bps.broadcast_parameters({"w": w, "b": b}, root_rank=0)      # plain NDArrays
"""

from __future__ import annotations

import types
from typing import Any, List, Optional

import mxnet as mx
from mxnet.gluon.parameter import DeferredInitializationError, Parameter, ParameterDict

from byteps.mxnet.ops import broadcast_

__all__ = ["broadcast_parameters", "broadcast_after_init", "parameter_name"]


def parameter_name(key: str, prefix: Optional[str] = None) -> str:
    """The byteps tensor name a parameter is broadcast under."""
    return f"{prefix or ''}Parameter.{key}"


def _broadcast_copies(param: Parameter, root_rank: int, name: str, process_set: Any = None) -> mx.nd.NDArray:
    """Broadcast a Parameter's first copy (over every rank, or ``process_set``'s) and copy it to its other
    contexts (in engine order)."""
    arrays = param.list_data()
    broadcast_(arrays[0], root_rank, name=name, process_set=process_set)
    for other in arrays[1:]:
        arrays[0].copyto(other)
    return arrays[0]


def broadcast_after_init(param: Parameter, root_rank: int, name: str, process_set: Any = None) -> None:
    """Make a deferred Parameter broadcast itself (over every rank, or ``process_set``'s) once its deferred
    initialisation has run."""
    init_impl = param._init_impl

    def init_then_broadcast(self: Parameter, *args: Any, **kwargs: Any) -> None:
        init_impl(*args, **kwargs)
        self._init_impl = init_impl  # once
        _broadcast_copies(self, root_rank, name, process_set)

    param._init_impl = types.MethodType(init_then_broadcast, param)


def broadcast_parameters(params: Any, root_rank: int = 0, prefix: Optional[str] = None) -> None:
    """Overwrite ``params`` on every rank with the root's, in the order of their keys.

    ``params`` is a gluon ``ParameterDict`` (``block.collect_params()``) or a
    dict of NDArrays or Parameters. Returns once every broadcast array is
    readable (as BytePS does), so a failure, e.g. ranks whose parameters
    differ in shape, is raised here, as ``MXNetError``.
    """
    if not isinstance(params, (dict, ParameterDict)):
        raise ValueError(f"broadcast_parameters: invalid params of type {type(params).__name__}; pass a gluon "
                         "ParameterDict (block.collect_params()) or a dict of NDArrays")
    broadcast: List[mx.nd.NDArray] = []
    for key, value in sorted(params.items(), key=lambda item: str(item[0])):
        name = parameter_name(str(key), prefix)
        if isinstance(value, Parameter):
            try:
                value.list_data()
            except DeferredInitializationError:
                broadcast_after_init(value, root_rank, name)
                continue
            broadcast.append(_broadcast_copies(value, root_rank, name))
        elif isinstance(value, mx.nd.NDArray):
            broadcast.append(broadcast_(value, root_rank, name=name))
        else:
            raise ValueError(f"broadcast_parameters: {key!r} is a {type(value).__name__}, "
                             "not an NDArray or a gluon Parameter")
    for array in broadcast:
        array.wait_to_read()
