"""The pieces every vision tower shares: patch embedding, pre-norm ViT blocks, norms, FFNs.

ref: llama.cpp tools/mtmd/clip.cpp (build_inp, build_vit, build_norm, build_ffn,
build_attn, build_rope_2d). Attention is flash attention with K/V cast to f16 and
f32 accumulation (clip's default on CPU and CUDA).
"""
from __future__ import annotations

import math

from ggserve.native import ggml


class Block:
    """One ViT block's tensors (`v.blk.{i}.*`, an audio encoder's `a.blk.{i}.*`); biases, the
    FFN gate optional. Families add q/k norms and post norms (None: the block has none)."""

    q_norm = k_norm = attn_post_norm = ffn_post_norm = None

    def __init__(self, w, i: int, e: int, f: int, tower: str = "v"):
        p = f"{tower}.blk.{i}."
        self.ln1_w = w.get(p + "ln1.weight", (e,))
        self.ln1_b = w.get(p + "ln1.bias", (e,), required=False)
        self.wq = w.get(p + "attn_q.weight", (e, e))
        self.wk = w.get(p + "attn_k.weight", (e, e))
        self.wv = w.get(p + "attn_v.weight", (e, e))
        self.bq = w.get(p + "attn_q.bias", (e,), required=False)
        self.bk = w.get(p + "attn_k.bias", (e,), required=False)
        self.bv = w.get(p + "attn_v.bias", (e,), required=False)
        self.wo = w.get(p + "attn_out.weight", (e, e))
        self.bo = w.get(p + "attn_out.bias", (e,), required=False)
        self.ln2_w = w.get(p + "ln2.weight", (e,))
        self.ln2_b = w.get(p + "ln2.bias", (e,), required=False)
        self.up = w.get(p + "ffn_up.weight", (e, f))
        self.up_b = w.get(p + "ffn_up.bias", (f,), required=False)
        self.gate = w.get(p + "ffn_gate.weight", (e, f), required=False)
        self.gate_b = w.get(p + "ffn_gate.bias", (f,), required=False)
        self.down = w.get(p + "ffn_down.weight", (f, e))
        self.down_b = w.get(p + "ffn_down.bias", (e,), required=False)


def norm_weights(w, name: str, e: int):
    """(weight, bias) of an optional norm `v.{name}` (either may be absent)."""
    return w.get(f"v.{name}.weight", (e,), required=False), w.get(f"v.{name}.bias", (e,), required=False)


def mlp_weights(w, first: str, second: str, n_in: int, biases: bool = True):
    """Two linear layers `{first}` [n_in, t] and `{second}` [t, n_out] (a projector)
    -> (w1, b1, w2, b2); biases required, or optional when not `biases`."""
    t = w.get(first + ".weight").ne[1]
    n_out = w.get(second + ".weight").ne[1]
    return (w.get(first + ".weight", (n_in, t)), w.get(first + ".bias", (t,), required=biases),
            w.get(second + ".weight", (t, n_out)), w.get(second + ".bias", (n_out,), required=biases))


def add(g, x, b):
    return g.add(x, b) if b is not None else x


def norm(g, x, w, b, eps, kind: str = "layer"):
    """build_norm: layer norm or RMS norm, then the optional weight and bias."""
    x = g.rms_norm(x, eps) if kind == "rms" else g.norm(x, eps)
    if w is not None:
        x = g.mul(x, w)
    return add(g, x, b)


def ffn(g, x, up, up_b, gate, gate_b, down, down_b, op: str):
    """build_ffn: up (and gate) -> activation (gated: op(gate) * up) -> down."""
    t = add(g, g.mul_mat(up, x), up_b)
    if gate is not None:
        h = add(g, g.mul_mat(gate, x), gate_b)
        h = {"silu": g.swiglu, "gelu": g.geglu}[op](h, t)
    else:
        h = {"gelu": g.gelu, "gelu_quick": g.gelu_quick, "silu": g.silu, "gelu_erf": g.gelu_erf}[op](t)
    if down is not None:
        h = add(g, g.mul_mat(down, h), down_b)
    return h


def patch_embed(g, patch_embd, patch_bias, width: int, height: int, p: int):
    """build_inp: conv p x p stride p -> (inp_raw f32 [width, height, 3], x [e, n_patches])."""
    if width % p or height % p:
        raise ValueError(f"tile {width}x{height} is not a multiple of the patch size {p}")
    e = patch_embd.ne[3]
    n_patches = (width // p) * (height // p)
    inp_raw = g.input("inp_raw", ggml.F32, (width, height, 3))
    x = g.conv_2d(patch_embd, inp_raw, p, p)                        # [nx, ny, e]
    x = g.cont(g.transpose(g.reshape(x, n_patches, e)))             # [e, n_patches]
    return inp_raw, add(g, x, patch_bias)


def attention(g, q, k, v, wo, bo, scale: float, mask=None):
    """build_attn (flash): q/k/v [d, n_head, n_pos] -> [e, n_pos] through wo."""
    d, n_head, n_pos = q.ne[0], q.ne[1], q.ne[2]
    q = g.permute(q, 0, 2, 1, 3)                                    # [d, n_pos, n_head]
    k = g.cast(g.permute(k, 0, 2, 1, 3), ggml.F16)
    v = g.cast(g.permute(v, 0, 2, 1, 3), ggml.F16)
    if mask is not None:
        mask = g.cast(mask, ggml.F16)
    a = g.flash_attn(q, k, v, mask, scale)                          # [d, n_head, n_pos]
    a = g.reshape(a, d * n_head, n_pos)
    return add(g, g.mul_mat(wo, a), bo)


def vit(g, x, blocks, *, n_head: int, eps: float, ffn_op: str, norm_kind: str = "layer",
        pre_ln=(None, None), post_ln=(None, None), rope=None, kq_scale: float | None = None,
        v_norm: bool = False, mask_of=None):
    """build_vit: x [e, n_pos] (position embeddings already added) -> [e, n_pos].

    rope: f(g, t) -> t applied to Q and K ([d_head, n_head, n_pos]) in every block, after
    the blocks' q/k norms; v_norm: V RMS-normed without weight; mask_of: il -> the
    attention mask of block il or None; kq_scale: default 1/sqrt(d_head)."""
    e, n_pos = x.ne[0], x.ne[1]
    d_head = e // n_head
    kq_scale = 1.0 / math.sqrt(d_head) if kq_scale is None else kq_scale
    if pre_ln[0] is not None:
        x = norm(g, x, pre_ln[0], pre_ln[1], eps, norm_kind)
    for il, B in enumerate(blocks):
        h = norm(g, x, B.ln1_w, B.ln1_b, eps, norm_kind)
        q = g.reshape(add(g, g.mul_mat(B.wq, h), B.bq), d_head, n_head, n_pos)
        k = g.reshape(add(g, g.mul_mat(B.wk, h), B.bk), d_head, n_head, n_pos)
        v = g.reshape(add(g, g.mul_mat(B.wv, h), B.bv), d_head, n_head, n_pos)
        if B.q_norm is not None:
            q = norm(g, q, B.q_norm, None, eps, norm_kind)
        if B.k_norm is not None:
            k = norm(g, k, B.k_norm, None, eps, norm_kind)
        if rope is not None:
            q, k = rope(g, q), rope(g, k)
        if v_norm:
            v = g.rms_norm(v, eps)
        a = attention(g, q, k, v, B.wo, B.bo, kq_scale, None if mask_of is None else mask_of(il))
        if B.attn_post_norm is not None:
            a = norm(g, a, B.attn_post_norm, None, eps, norm_kind)
        x = g.add(a, x)
        h = norm(g, x, B.ln2_w, B.ln2_b, eps, norm_kind)
        h = ffn(g, h, B.up, B.up_b, B.gate, B.gate_b, B.down, B.down_b, ffn_op)
        if B.ffn_post_norm is not None:
            h = norm(g, h, B.ffn_post_norm, None, eps, norm_kind)
        x = g.add(x, h)
    if post_ln[0] is not None:
        x = norm(g, x, post_ln[0], post_ln[1], eps, norm_kind)
    return x


def rope_2d(g, t, pos_a, pos_b, theta: float, interleave_freq: bool = True):
    """build_rope_2d: dims [0, d/2) rotated by pos_a, [d/2, d) by pos_b (odd frequencies
    when interleave_freq). t: [d, n_head, n_pos]; pos_*: i32 [n_pos]."""
    d = t.ne[0]
    scale_odd = theta ** (-2.0 / d) if interleave_freq else 1.0
    t = g.rope(t, pos_a, d // 2, 0, 0, theta, 1.0, 0.0, 1.0, 0.0, 0.0)
    t = g.rope(t, pos_b, d // 2, 0, 0, theta, scale_odd, 0.0, 1.0, 0.0, 0.0)
    return g.rope_set_offset(t, d // 2)
