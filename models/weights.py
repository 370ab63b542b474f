"""Weights declared by their GGUF names, looked up with clear errors."""
from __future__ import annotations

from ggserve.models.registry import ModelError


class Weights:
    """Tensor lookup by GGUF name ('blk.3.attn_q.weight') with shape checks."""

    def __init__(self, tensors: dict, path: str = ""):
        self.tensors = tensors
        self.path = path

    def get(self, name: str, shape: tuple | None = None, required: bool = True):
        t = self.tensors.get(name)
        if t is None:
            if required:
                raise ModelError(f"{self.path}: missing tensor {name!r}")
            return None
        if shape is not None and tuple(t.ne[: len(shape)]) != tuple(shape):
            raise ModelError(f"{self.path}: tensor {name!r} has shape {t.ne[:len(shape)]}, expected {tuple(shape)}")
        return t

    def __contains__(self, name: str) -> bool:
        return name in self.tensors
