"""GLM-4.5 / 4.6 / 4.7 mixture-of-experts text models (GGUF arch `glm4moe`).

ref: llama.cpp src/models/glm4-moe.cpp. Attention with q/k/v biases and (GLM-4.5
355B) per-head q/k RMS norms, NEOX rope on the first `rope.dimension_count` dims
of each head; `post_attention_norm` is the FFN's pre-norm. The first
`leading_dense_block_count` layers have a dense SwiGLU FFN, the others a MoE
routed as DeepSeek V3 routes (sigmoid scores, `exp_probs_b` added for the
selection only, group-limited when the file has expert groups, chosen weights
normalised and scaled) plus a shared expert. The last `nextn_predict_layers`
blocks are the NextN/MTP head: loaded by llama.cpp but skipped by its forward
pass, and not loaded here.
"""
from __future__ import annotations

import math

from ggserve.models import blocks, moe
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights
from ggserve.native import ggml


@register("glm4moe")
class Glm4MoeModel(Decoder):
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.n_layer -= hp.get("nextn_predict_layers", 0)     # the NextN blocks are not run
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        self.routing = moe.Routing.from_hparams(hp, path, moe.GATING_SIGMOID)
        self.n_ff_exp = hp.get("expert_feed_forward_length", required=True)
        n_shared = hp.get("expert_shared_count", 0)
        n_dense = hp.get("leading_dense_block_count", 0)
        self.rope_scaling = RopeScaling.from_hparams(hp)
        self.kq_scale = 1.0 / math.sqrt(self.head_dim)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        d = self.head_dim
        qk_norms = [("q_norm", "attn_q_norm.weight", (d,), False), ("k_norm", "attn_k_norm.weight", (d,), False)]
        ffn_norm = [("ffn_norm", "post_attention_norm.weight", (self.n_embd,), True)]
        self.layers = []
        for i in range(self.n_layer):
            attn = blocks.attention_weights(self, qkv_bias=True) + qk_norms + ffn_norm
            if i < n_dense:
                L = blocks.Layer(w, i, attn, blocks.ffn_weights(self, norm=None))
                L.shared = False
            else:
                shexp = blocks.ffn_weights(self, self.n_ff_exp * n_shared, norm=None, suffix="_shexp") \
                    if n_shared else []
                L = blocks.Layer(w, i, attn, shexp)
                L.shared = n_shared > 0
                L.experts = moe.Experts(w, i, self.n_embd, self.n_ff_exp, self.routing.n_expert, probs_bias=True)
            self.layers.append(L)

    def rope(self, g, il, t, pos):
        return self.rope_scaling.apply(g, t, pos, self.n_rot, self.rope_type)

    def ffn(self, g, inp, il, L, h):
        if L.experts is None:
            return blocks.swiglu_ffn(g, inp, L, h)
        out = moe.moe_ffn(g, inp, h, L.experts, self.routing)
        return g.add(out, blocks.swiglu_ffn(g, inp, L, h)) if L.shared else out
