"""The pieces decoder layers share, as llama.cpp's llm_graph_context builds them
(build_norm, build_attn's projections, build_ffn), and per-layer weight tables.

ref: llama.cpp src/llama-graph.cpp. A table row is (attribute, GGUF name below
`blk.{i}.`, shape, required); `Layer` loads the rows it is given, so a model
declares exactly the tensors its llama.cpp graph reads.
"""
from __future__ import annotations

import itertools

import numpy as np


class Layer:
    """One decoder layer's tensors, attributes named as the forward pass reads them.
    An optional tensor the file lacks, or one the architecture does not declare, is None."""

    bq = bk = bv = bo = q_norm = k_norm = sinks = attn_post_norm = ffn_post_norm = out_scale = None
    attn_norm = ffn_norm = None     # absent: no pre-norm (OLMo 2, EXAONE 4 norm the outputs only)
    experts = None

    def __init__(self, w, i: int, *tables):
        self.load(w, i, *tables)

    def load(self, w, i: int, *tables) -> None:
        p = f"blk.{i}."
        for attr, name, shape, required in itertools.chain(*tables):
            setattr(self, attr, w.get(p + name, shape, required=required))


def attention_weights(m, *, qk_norm: bool = False, qkv_bias: bool = False, out_bias: bool | None = None,
                      v_required: bool = True, norm: str | None = "attn_norm", head_dim: int = 0, n_head: int = 0,
                      n_head_kv: int = 0) -> list:
    """attn_norm (None: no pre-norm) and the q/k/v/output projections of model m's
    dimensions (head_dim, n_head, n_head_kv override them); per-head q/k norms, optional
    q/k/v biases, the output bias (None: not read, False: optional, True: required)."""
    e, d = m.n_embd, head_dim or m.head_dim
    n_q, n_kv = d * (n_head or m.n_head), d * (n_head_kv or m.n_head_kv)
    rows = [("attn_norm", norm + ".weight", (e,), True)] if norm else []
    rows += [("wq", "attn_q.weight", (e, n_q), True),
             ("wk", "attn_k.weight", (e, n_kv), True),
             ("wv", "attn_v.weight", (e, n_kv), v_required),
             ("wo", "attn_output.weight", (n_q, e), True)]
    if qkv_bias:
        rows += [("bq", "attn_q.bias", (n_q,), False), ("bk", "attn_k.bias", (n_kv,), False),
                 ("bv", "attn_v.bias", (n_kv,), False)]
    if out_bias is not None:
        rows.append(("bo", "attn_output.bias", (e,), out_bias))
    if qk_norm:
        rows += [("q_norm", "attn_q_norm.weight", (d,), True), ("k_norm", "attn_k_norm.weight", (d,), True)]
    return rows


def ffn_weights(m, n_ff: int = 0, *, norm: str | None = "ffn_norm", suffix: str = "") -> list:
    """The FFN's norm (None: not read here) and gate/up/down matrices (`suffix`
    "_shexp": a shared expert), of width n_ff (default m.n_ff)."""
    e, f = m.n_embd, n_ff or m.n_ff
    rows = [("ffn_norm", norm + ".weight", (e,), True)] if norm else []
    return rows + [("ffn_gate", f"ffn_gate{suffix}.weight", (e, f), True),
                   ("ffn_up", f"ffn_up{suffix}.weight", (e, f), True),
                   ("ffn_down", f"ffn_down{suffix}.weight", (f, e), True)]


def post_norm_weights(m) -> list:
    """Gemma's norms after attention and after the FFN (before each residual add)."""
    return [("attn_post_norm", "post_attention_norm.weight", (m.n_embd,), True),
            ("ffn_post_norm", "post_ffw_norm.weight", (m.n_embd,), True)]


# -- graph pieces -------------------------------------------------------------------

def norm(g, x, w, eps: float):
    """RMS norm times its weight."""
    return g.mul(g.rms_norm(x, eps), w)


def pre_norm(g, x, w, eps: float):
    """A sub-layer's input norm; x as it is where the layer has none (w None)."""
    return x if w is None else norm(g, x, w, eps)


def linear(g, inp, w, b, x):
    """w @ x (+ b when the layer has the bias)."""
    y = inp.mm(g, w, x)
    return y if b is None else g.add(y, b)


def qkv(g, inp, L, h, head_dim: int, n_head: int, n_head_kv: int):
    """h [n_embd, n_tokens] -> q [head_dim, n_head, n_tokens], k, v [head_dim, n_head_kv, n_tokens]."""
    n = inp.n_tokens
    q = g.reshape(linear(g, inp, L.wq, L.bq, h), head_dim, n_head, n)
    k = g.reshape(linear(g, inp, L.wk, L.bk, h), head_dim, n_head_kv, n)
    v = g.reshape(linear(g, inp, L.wv, L.bv, h), head_dim, n_head_kv, n)
    return q, k, v


def swiglu_ffn(g, inp, L, h):
    """ffn_down(silu(ffn_gate h) * ffn_up h)."""
    return inp.mm(g, L.ffn_down, g.swiglu(inp.mm(g, L.ffn_gate, h), inp.mm(g, L.ffn_up, h)))


def geglu_ffn(g, inp, L, h):
    """ffn_down(gelu(ffn_gate h) * ffn_up h)."""
    return inp.mm(g, L.ffn_down, g.geglu(inp.mm(g, L.ffn_gate, h), inp.mm(g, L.ffn_up, h)))


def swa_layers(pattern, n_layer: int) -> list[bool]:
    """llama.cpp's set_swa_pattern: per-layer flags as given, or every layer but each
    pattern-th sliding (pattern 0: all)."""
    if isinstance(pattern, (list, tuple)):
        return [bool(x) for x in pattern]
    return [pattern == 0 or il % pattern < pattern - 1 for il in range(n_layer)]


def attention_temperature(positions: np.ndarray, scale: float, floor_scale: int, offset: float = 0.0) -> np.ndarray:
    """f32 per token: 1 + scale * ln(1 + floor((pos + offset) / floor_scale)), with
    llama.cpp's types (float position and quotient, double logarithm), as
    llm_graph_input_attn_temp computes it on the host."""
    f32 = np.float32
    q = np.floor((positions.astype(f32) + f32(offset)) / f32(floor_scale)).astype(np.float64)
    return (np.log(q + 1.0) * np.float64(f32(scale)) + 1.0).astype(f32)
