"""Mistral 3 (Ministral 3) text models: Llama blocks with YaRN rope and Llama-4-style
attention temperature.

ref: llama.cpp src/models/mistral3.cpp: NORM rope with YaRN (models/rope.py); when
`attention.temperature_scale` is set, queries are multiplied after rope by
1 + scale * ln(1 + floor(pos / n_ctx_orig)) (llm_graph_input_attn_temp, computed
per token on the host in double precision, as llama.cpp does).
"""
from __future__ import annotations

import math

from ggserve.models import blocks
from ggserve.models.blocks import attention_temperature  # noqa: F401  (its home before blocks.py)
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import ModelError, register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights


@register("mistral3")
class Mistral3Model(Decoder):
    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        self.rope_scaling = RopeScaling.from_hparams(hp)
        self.kq_scale = hp.get("attention.scale", 0.0) or 1.0 / math.sqrt(self.head_dim)
        self.temp_scale = hp.get("attention.temperature_scale", 0.0)
        if self.temp_scale and not self.rope_scaling.n_ctx_orig:
            raise ModelError(f"{path}: attention temperature scaling needs rope.scaling.original_context_length")
        if self.temp_scale:
            self.temperature = (self.temp_scale, self.rope_scaling.n_ctx_orig)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.rope_freqs = w.get("rope_freqs.weight", (self.n_rot // 2,), required=False)
        self.layers = [blocks.Layer(w, i, blocks.attention_weights(self, out_bias=False), blocks.ffn_weights(self))
                       for i in range(self.n_layer)]

    def rope(self, g, il, t, pos):
        return self.rope_scaling.apply(g, t, pos, self.n_rot, self.rope_type, self.rope_freqs)
