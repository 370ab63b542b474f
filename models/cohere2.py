"""Cohere Command R7B (`cohere2`): one LayerNorm per layer feeding attention and the
FFN in parallel, sliding-window layers with rope and every 4th layer global without.

ref: llama.cpp src/models/cohere2-iswa.cpp and the COHERE2 hparams in
src/llama-model.cpp: LayerNorm without bias (`attention.layer_norm_epsilon`), the
layer's output (ffn(n(x)) + x) + attn(n(x)) in that order; NORMAL rope on the
sliding layers only (llama.cpp's set_swa_pattern(4): layers 3, 7, ... global);
1/sqrt(head_dim) attention scale; SwiGLU FFN; the LM head is always the token
embeddings, its logits times `logit_scale`. As llama.cpp's iSWA cache, the sliding
layers keep their K/V in a window + ubatch ring (`LayerKV.window_cache`): once the
ring wraps, the order flash attention visits the cells in changes the logits.
"""
from __future__ import annotations

import dataclasses
import math

from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.registry import register
from ggserve.models.weights import Weights
from ggserve.native import ggml

SWA_PATTERN = 4


def layer_norm(g, x, w, eps: float):
    """Mean-centred LayerNorm times its weight (no bias): llama.cpp's LLM_NORM."""
    return g.mul(g.norm(x, eps), w)


@register("cohere2")
class Cohere2Model(Decoder):
    rope_type = ggml.ROPE_NORMAL

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.eps = hp.get("attention.layer_norm_epsilon", required=True)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        self.rope_base = hp.get("rope.freq_base", 10000.0)
        self.n_ctx_orig = hp.get("context_length", 0)
        self.kq_scale = 1.0 / math.sqrt(self.head_dim)
        self.logit_scale = hp.get("logit_scale", required=True)
        self.window = hp.get("attention.sliding_window", required=True)
        self.swa_layers = blocks.swa_layers(SWA_PATTERN, self.n_layer)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.output = self.tok_embd                    # llama.cpp reads no output.weight for cohere2
        self.layers = [blocks.Layer(w, i, blocks.attention_weights(self, qkv_bias=True, out_bias=False),
                                    blocks.ffn_weights(self, norm=None))
                       for i in range(self.n_layer)]

    def memory_layers(self, device_of_layer):
        """The sliding-window layers in a window-sized ring of cells (llama.cpp's iSWA cache)."""
        return [dataclasses.replace(spec, window_cache=bool(spec.sliding_window))
                for spec in super().memory_layers(device_of_layer)]

    def layer(self, g, inp, il, L, x, temp):
        """x + ffn(n(x)) + attention(n(x)), one LayerNorm feeding both."""
        h = layer_norm(g, x, L.attn_norm, self.eps)                     # [n_embd, n_tokens]
        a = self.attention(g, inp, il, L, h, temp)
        if il == self.n_layer - 1 and inp.out_ids is not None:
            a, x, h = g.get_rows(a, inp.out_ids), g.get_rows(x, inp.out_ids), g.get_rows(h, inp.out_ids)
        return g.add(g.add(self.ffn(g, inp, il, L, h), x), a)

    def rope(self, g, il, t, pos):
        if not self.swa_layers[il]:
            return t
        return g.rope(t, pos, self.n_rot, self.rope_type, self.n_ctx_orig, self.rope_base, 1.0,
                      0.0, 1.0, 32.0, 1.0, None)

    def shift_k(self, g, il, k, shift):
        """llama.cpp's K-shift rotates the global layers' keys too, though their forward has no rope."""
        return g.rope(k, shift, self.n_rot, self.rope_type, self.n_ctx_orig, self.rope_base, 1.0,
                      0.0, 1.0, 32.0, 1.0, None)

    def head(self, g, inp, x):
        x = layer_norm(g, x, self.output_norm, self.eps)
        return g.scale(inp.head(g, self.output, x), self.logit_scale)
