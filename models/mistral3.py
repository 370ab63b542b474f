"""Mistral 3 (Ministral 3) text models: Llama blocks with YaRN rope and Llama-4-style
attention temperature.

ref: llama.cpp src/models/mistral3.cpp: NORM rope with YaRN (models/rope.py); when
`attention.temperature_scale` is set, queries are multiplied after rope by
1 + scale * ln(1 + floor(pos / n_ctx_orig)) (llm_graph_input_attn_temp, computed
per token on the host in double precision, as llama.cpp does).
"""
from __future__ import annotations

import math

import numpy as np

from ggserve.native import ggml
from ggserve.models.hparams import HParams
from ggserve.models.memory import LayerKV, global_attention_layers
from ggserve.models.registry import ModelError, register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights

ATTN_SCALE_INPUT = "attn_temp_scale"


def attention_temperature(positions: np.ndarray, scale: float, floor_scale: int, offset: float = 0.0) -> np.ndarray:
    """f32 per token: 1 + scale * ln(1 + floor((pos + offset) / floor_scale)), with
    llama.cpp's types (float position and quotient, double logarithm)."""
    f32 = np.float32
    q = np.floor((positions.astype(f32) + f32(offset)) / f32(floor_scale)).astype(np.float64)
    return (np.log(q + 1.0) * np.float64(f32(scale)) + 1.0).astype(f32)


class Layer:
    def __init__(self, w: Weights, i: int, n_embd: int, n_q: int, n_kv: int, n_ff: int):
        p = f"blk.{i}."
        self.attn_norm = w.get(p + "attn_norm.weight", (n_embd,))
        self.wq = w.get(p + "attn_q.weight", (n_embd, n_q))
        self.wk = w.get(p + "attn_k.weight", (n_embd, n_kv))
        self.wv = w.get(p + "attn_v.weight", (n_embd, n_kv))
        self.wo = w.get(p + "attn_output.weight", (n_q, n_embd))
        self.bo = w.get(p + "attn_output.bias", (n_embd,), required=False)
        self.ffn_norm = w.get(p + "ffn_norm.weight", (n_embd,))
        self.ffn_gate = w.get(p + "ffn_gate.weight", (n_embd, n_ff))
        self.ffn_up = w.get(p + "ffn_up.weight", (n_embd, n_ff))
        self.ffn_down = w.get(p + "ffn_down.weight", (n_ff, n_embd))


@register("mistral3")
class Mistral3Model:
    rope_type = ggml.ROPE_NORMAL

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        self.rope = RopeScaling.from_hparams(hp)
        self.kq_scale = hp.get("attention.scale", 0.0) or 1.0 / math.sqrt(self.head_dim)
        self.temp_scale = hp.get("attention.temperature_scale", 0.0)
        if self.temp_scale and not self.rope.n_ctx_orig:
            raise ModelError(f"{path}: attention temperature scaling needs rope.scaling.original_context_length")

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.rope_freqs = w.get("rope_freqs.weight", (self.n_rot // 2,), required=False)
        n_q, n_kv = self.head_dim * self.n_head, self.head_dim * self.n_head_kv
        self.layers = [Layer(w, i, self.n_embd, n_q, n_kv, self.n_ff) for i in range(self.n_layer)]

    def memory_layers(self, device_of_layer) -> list[LayerKV]:
        return global_attention_layers(self, device_of_layer)

    def step_values(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        """Per-step graph inputs beside the tokens, from the batch's positions [n_pos, n_tokens]."""
        if not self.temp_scale:
            return {}
        return {ATTN_SCALE_INPUT: attention_temperature(positions[0], self.temp_scale, self.rope.n_ctx_orig)}

    def forward(self, g, inp):
        """-> logits [n_vocab, n_outputs]."""
        n_tokens = inp.n_tokens
        attn_scale = g.input(ATTN_SCALE_INPUT, ggml.F32, (1, 1, n_tokens)) if self.temp_scale else None
        x = inp.embed(g, self.tok_embd)                                          # [n_embd, n_tokens]
        for il, L in enumerate(self.layers):
            h = g.mul(g.rms_norm(x, self.eps), L.attn_norm)
            q = g.reshape(inp.mm(g, L.wq, h), self.head_dim, self.n_head, n_tokens)
            k = g.reshape(inp.mm(g, L.wk, h), self.head_dim, self.n_head_kv, n_tokens)
            v = g.reshape(inp.mm(g, L.wv, h), self.head_dim, self.n_head_kv, n_tokens)
            q = self.rope.apply(g, q, inp.positions, self.n_rot, self.rope_type, self.rope_freqs)
            k = self.rope.apply(g, k, inp.positions, self.n_rot, self.rope_type, self.rope_freqs)
            if attn_scale is not None:
                q = g.mul(q, attn_scale)
            a = inp.mm(g, L.wo, inp.kv.attention(g, il, q, k, v, self.kq_scale))
            if L.bo is not None:
                a = g.add(a, L.bo)
            if il == self.n_layer - 1 and inp.out_ids is not None:
                a = g.get_rows(a, inp.out_ids)
                x = g.get_rows(x, inp.out_ids)
            x = g.add(a, x)
            h = g.mul(g.rms_norm(x, self.eps), L.ffn_norm)
            h = g.swiglu(inp.mm(g, L.ffn_gate, h), inp.mm(g, L.ffn_up, h))
            x = g.add(inp.mm(g, L.ffn_down, h), x)
        x = g.mul(g.rms_norm(x, self.eps), self.output_norm)
        return inp.head(g, self.output, x)
