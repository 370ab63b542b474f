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

    def read_transformer(self, model, eps_default: float) -> None:
        """Set the dimensions every decoder-only transformer has on `model`."""
        model.arch = self.arch
        model.n_embd = self.get("embedding_length", required=True)
        model.n_layer = self.get("block_count", required=True)
        model.n_head = self.get("attention.head_count", required=True)
        model.n_head_kv = self.get("attention.head_count_kv", model.n_head)
        model.head_dim = self.get("attention.key_length", model.n_embd // model.n_head)
        model.n_ff = self.get("feed_forward_length", required=True)
        model.eps = self.get("attention.layer_norm_rms_epsilon", eps_default)

    def read_linear_rope(self, model) -> None:
        """rope_base, rope_scale (1 / factor under linear scaling, else 1) and
        n_ctx_orig (the scaling's original context, else the trained one)."""
        model.rope_base = self.get("rope.freq_base", 10000.0)
        factor = self.get("rope.scaling.factor", 0.0)
        model.rope_scale = 1.0 / factor if self.get("rope.scaling.type", "none") == "linear" and factor else 1.0
        model.n_ctx_orig = self.get("rope.scaling.original_context_length", self.get("context_length", 0))
