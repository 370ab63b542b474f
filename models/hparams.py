"""Reading `{arch}.*` hyperparameters from GGUF metadata."""
from __future__ import annotations

from ggserve.models.registry import ModelError


class HParams:
    def __init__(self, meta: dict, path: str = ""):
        self.meta = meta
        self.path = path
        self.arch = meta.get("general.architecture")

    def get(self, key: str, default=None, required: bool = False):
        full = f"{self.arch}.{key}"
        if full in self.meta:
            return self.meta[full]
        if required:
            raise ModelError(f"{self.path}: missing metadata {full!r}")
        return default
