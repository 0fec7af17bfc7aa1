"""to_host: the copy that every value leaving a learner or an env runner goes through.

A tensor pickled on a GPU is unpickled onto that GPU: a process that sees none (a sweep's
trial on a CPU-only node, a CPU-only torch) cannot read it, and one that sees the node's GPUs
opens a CUDA context of its own on the first of them just to hold it. So what crosses a
process boundary, or is written to a checkpoint, holds CPU tensors only.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch


def to_host(value: Any) -> Any:
    """`value` with every tensor inside it (dicts, lists, tuples, dataclasses) on the CPU and
    detached. Tensors already on the CPU and objects holding none are returned as they are,
    so the usual path (numpy batches, float stats) copies nothing."""
    if isinstance(value, torch.Tensor):
        return value if value.device.type == "cpu" else value.detach().to("cpu")
    if isinstance(value, dict):
        items = {k: to_host(v) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else type(value)(items)
    if isinstance(value, (list, tuple)):
        items = [to_host(v) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*items)
        return type(value)(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: to_host(getattr(value, f.name)) for f in dataclasses.fields(value)}
        changed = {k: v for k, v in changed.items() if v is not getattr(value, k)}
        return dataclasses.replace(value, **changed) if changed else value
    return value
