"""What the cluster benchmark moves: one big tensor and three models' gradients.

The gradient shapes of ResNet-50, VGG-16 (torchvision's definitions) and
BERT-base (Hugging Face's ``BertModel``, pooler included) are generated
here from the architectures, so no framework and no weights are needed;
the parameter counts are checked against the published ones. Tensors are
listed in backward order (last layer first), the order in which a training
step produces its gradients.

Example::

    for name, shape in gradient_shapes("resnet50"): ...
    workload_bytes("vgg16")     # 553430176
"""

from __future__ import annotations

from math import prod
from typing import List, Tuple

__all__ = ["WORKLOADS", "gradient_shapes", "workload_bytes", "TENSOR_100MB"]

Shape = Tuple[int, ...]
TENSOR_100MB = 25_000_000  # float32 elements: 100e6 bytes


def _resnet50() -> List[Tuple[str, Shape]]:
    out: List[Tuple[str, Shape]] = [("conv1.weight", (64, 3, 7, 7)), ("bn1.weight", (64,)), ("bn1.bias", (64,))]
    in_planes = 64
    for stage, (planes, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3)), start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            for conv, shape in (("1", (planes, in_planes, 1, 1)), ("2", (planes, planes, 3, 3)),
                                ("3", (planes * 4, planes, 1, 1))):
                out += [(f"{p}.conv{conv}.weight", shape), (f"{p}.bn{conv}.weight", (shape[0],)),
                        (f"{p}.bn{conv}.bias", (shape[0],))]
            if b == 0:
                out += [(f"{p}.downsample.0.weight", (planes * 4, in_planes, 1, 1)),
                        (f"{p}.downsample.1.weight", (planes * 4,)), (f"{p}.downsample.1.bias", (planes * 4,))]
            in_planes = planes * 4
    return out + [("fc.weight", (1000, 2048)), ("fc.bias", (1000,))]


def _vgg16() -> List[Tuple[str, Shape]]:
    out: List[Tuple[str, Shape]] = []
    in_channels, index = 3, 0
    for width in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if width != "M":
            out += [(f"features.{index}.weight", (width, in_channels, 3, 3)), (f"features.{index}.bias", (width,))]
            in_channels = width
            index += 1  # the ReLU
        index += 1
    for index, (fan_out, fan_in) in zip((0, 3, 6), ((4096, 512 * 7 * 7), (4096, 4096), (1000, 4096))):
        out += [(f"classifier.{index}.weight", (fan_out, fan_in)), (f"classifier.{index}.bias", (fan_out,))]
    return out


def _bert_base() -> List[Tuple[str, Shape]]:
    hidden, inner, layers = 768, 3072, 12
    out: List[Tuple[str, Shape]] = [
        ("embeddings.word_embeddings.weight", (30522, hidden)),
        ("embeddings.position_embeddings.weight", (512, hidden)),
        ("embeddings.token_type_embeddings.weight", (2, hidden)),
        ("embeddings.LayerNorm.weight", (hidden,)), ("embeddings.LayerNorm.bias", (hidden,)),
    ]
    for i in range(layers):
        p = f"encoder.layer.{i}"
        for part in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            out += [(f"{p}.{part}.weight", (hidden, hidden)), (f"{p}.{part}.bias", (hidden,))]
        out += [(f"{p}.attention.output.LayerNorm.weight", (hidden,)),
                (f"{p}.attention.output.LayerNorm.bias", (hidden,)),
                (f"{p}.intermediate.dense.weight", (inner, hidden)), (f"{p}.intermediate.dense.bias", (inner,)),
                (f"{p}.output.dense.weight", (hidden, inner)), (f"{p}.output.dense.bias", (hidden,)),
                (f"{p}.output.LayerNorm.weight", (hidden,)), (f"{p}.output.LayerNorm.bias", (hidden,))]
    return out + [("pooler.dense.weight", (hidden, hidden)), ("pooler.dense.bias", (hidden,))]


_MODELS = {"resnet50": (_resnet50, 25_557_032), "vgg16": (_vgg16, 138_357_544), "bert-base": (_bert_base, 109_482_240)}
WORKLOADS = ("100MB", "resnet50", "vgg16", "bert-base")


def gradient_shapes(workload: str) -> List[Tuple[str, Shape]]:
    """(name, shape) of every float32 gradient of a workload, in backward order."""
    if workload == "100MB":
        return [("tensor100MB", (TENSOR_100MB,))]
    if workload == "tiny":  # the smoke test's: a few partitions, a second or less on any rig
        return [("tiny.a", (100_000,)), ("tiny.b", (3,))]
    try:
        build, expected = _MODELS[workload]
    except KeyError:
        raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}") from None
    shapes = build()
    count = sum(prod(shape) for _, shape in shapes)
    if count != expected:
        raise AssertionError(f"{workload}: generated {count} parameters, the published model has {expected}")
    return list(reversed(shapes))


def workload_bytes(workload: str) -> int:
    """Bytes of float32 gradient one worker contributes per step (M in the bounds)."""
    return 4 * sum(prod(shape) for _, shape in gradient_shapes(workload))
