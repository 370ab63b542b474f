"""LFM2 (Liquid): short-convolution layers with a recurrent state per sequence,
and attention layers where `attention.head_count_kv` is non-zero.

ref: llama.cpp src/models/lfm2.cpp (build_shortconv_block, build_attn_block).

- Short conv: `shortconv.in_proj` gives three n_embd-wide thirds (b, c, x); b * x
  goes through a causal depthwise convolution of `shortconv.l_cache` taps (state:
  the last l_cache - 1 inputs of each channel), the result is gated by c and
  projected by `shortconv.out_proj`.
- Attention: q and k RMS-normed per head, NeoX rope, 1/sqrt(head_dim); with
  `attention.sliding_window` > 0 every attention layer attends within that window.
Both are pre-norm residual layers followed by a SwiGLU FFN; the final norm is
`token_embd_norm` and the LM head the tied token embeddings unless `output` exists.
"""
from __future__ import annotations

import math

import numpy as np

from ggserve.models import blocks
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.memory import LayerKV, LayerRecurrent, equal_blocks
from ggserve.models.registry import ModelError, register
from ggserve.models.weights import Weights
from ggserve.native import ggml

F32 = 4     # bytes


@register("lfm2")
class Lfm2Model(Decoder):
    rope_type = ggml.ROPE_NEOX

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-5)
        kv = self.n_head_kv                                                 # per layer: 0 = short conv
        self.kv_heads = [int(x) for x in kv] if np.ndim(kv) else [int(kv)] * self.n_layer
        self.is_recurrent = [n == 0 for n in self.kv_heads]
        self.n_head_kv = max(self.kv_heads)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        self.rope_base = hp.get("rope.freq_base", 10000.0)
        self.n_ctx_orig = hp.get("context_length", 0)
        self.kq_scale = 1.0 / math.sqrt(self.head_dim)
        # a sliding window, when the file gives one, on every attention layer (llama.cpp's iswa graph)
        self.window = hp.get("attention.sliding_window", 0) or 0
        self.d_conv = hp.get("shortconv.l_cache", required=True) - 1    # conv inputs kept per channel
        if self.d_conv < 1:
            raise ModelError(f"{path}: lfm2.shortconv.l_cache must be > 1")

        w = Weights(tensors, path)
        self.n_vocab = w.get("token_embd.weight").ne[1]
        self.tok_embd = w.get("token_embd.weight", (self.n_embd, self.n_vocab))
        self.output_norm = w.get("token_embd_norm.weight", (self.n_embd,))
        output = w.get("output.weight", (self.n_embd, self.n_vocab), required=False)
        self.output = self.tok_embd if output is None else output
        self.layers = [self._layer(w, i) for i in range(self.n_layer)]

    def _layer(self, w: Weights, i: int) -> blocks.Layer:
        e = self.n_embd
        if self.is_recurrent[i]:
            mixer = [("attn_norm", "attn_norm.weight", (e,), True),
                     ("in_proj", "shortconv.in_proj.weight", (e, 3 * e), True),
                     ("conv", "shortconv.conv.weight", (self.d_conv + 1, e), True),
                     ("out_proj", "shortconv.out_proj.weight", (e, e), True)]
        else:
            mixer = blocks.attention_weights(self, qk_norm=True, n_head_kv=self.kv_heads[i])
        L = blocks.Layer(w, i, mixer, blocks.ffn_weights(self))
        L.recurrent = self.is_recurrent[i]
        return L

    def memory_layers(self, device_of_layer) -> list:
        """Attention layers keep K/V per token; short-conv layers the last d_conv
        inputs of each channel per sequence."""
        return [LayerRecurrent((self.d_conv * self.n_embd,), device_of_layer(il)) if r else
                LayerKV(self.head_dim * n, self.head_dim * n, device_of_layer(il), self.window)
                for il, (r, n) in enumerate(zip(self.is_recurrent, self.kv_heads))]

    def attention(self, g, inp, il, L, h, temp):
        if L.recurrent:
            return self._short_conv(g, inp, il, L, h)
        return super().attention(g, inp, il, L, h, temp)

    def qkv(self, g, inp, il, L, h):
        return blocks.qkv(g, inp, L, h, self.head_dim, self.n_head, self.kv_heads[il])

    def rope(self, g, il, t, pos):
        return g.rope(t, pos, self.n_rot, self.rope_type, self.n_ctx_orig, self.rope_base)

    def _short_conv(self, g, inp, il, L, h):
        e, n, k = self.n_embd, inp.n_tokens, self.d_conv
        bcx = inp.mm(g, L.in_proj, h)                                      # [3 * n_embd, n]
        b = g.view(bcx, (e, n), (bcx.nb[1],), 0)
        c = g.view(bcx, (e, n), (bcx.nb[1],), e * F32)
        x = g.view(bcx, (e, n), (bcx.nb[1],), 2 * e * F32)
        bx = g.mul(b, x)                                                   # [n_embd, n]
        states = inp.recurrent.state(g, il, 0)                             # [d_conv * n_embd, n_seqs]
        outs, new_states = [], []
        # one convolution per run of sequences with as many rows each (llama.cpp's equal split)
        for r0, nt, s0, ns in equal_blocks(inp.seq_rows):
            rows = g.view(bx, (e, nt, ns), (bx.nb[1], bx.nb[1] * nt), r0 * bx.nb[1])
            prev = g.view(states, (k, e, ns), (k * F32, states.nb[1]), s0 * states.nb[1])
            conv_in = g.concat(prev, g.transpose(rows), 0)                 # [d_conv + nt, n_embd, ns]
            nxt = g.view(conv_in, (k, e, ns), (conv_in.nb[1], conv_in.nb[2]), nt * F32)
            new_states.append(g.reshape(g.cont(nxt), k * e, ns))
            outs.append(g.reshape(g.ssm_conv(conv_in, L.conv), e, nt * ns))   # [n_embd, nt * ns]
        inp.recurrent.store(g, il, 0, _join(g, new_states))
        y = g.mul(c, _join(g, outs))                                       # [n_embd, n]
        return inp.mm(g, L.out_proj, y)


def _join(g, parts):
    """Concatenate 2-D tensors along their columns (one part: as it is)."""
    out = parts[0]
    for p in parts[1:]:
        out = g.concat(out, p, 1)
    return out
