"""Qwen3.5: gated-delta-net (linear attention) layers with a recurrent state per
sequence, and every `full_attention_interval`-th layer gated full attention with
interleaved M-RoPE.

ref: llama.cpp src/models/qwen35.cpp, src/models/delta-net-base.cpp (the fused
ggml_gated_delta_net path, which llama.cpp takes wherever the backend has the op)
and build_gdn_l2_norm in src/models/models.h.

- Full attention: the query projection is twice as wide (per head: query, then an
  output gate); q and k are RMS-normed per head, rotated by IMROPE over 4 position
  dimensions; the attention output is multiplied by sigmoid(gate).
- Gated delta net: q|k|v go through a causal depthwise convolution (state: the
  last d_conv - 1 inputs), SiLU, L2 norm of q and k, then the delta rule (state:
  an [S, S] matrix per value head) with decay exp(-exp(A_log) * softplus(alpha +
  dt_bias)) and write strength sigmoid(beta); the output is RMS-normed and gated
  by SiLU(z).
Both layer kinds are followed by a SwiGLU FFN; norms are pre-norms.
"""
from __future__ import annotations

import numpy as np

from ggserve.native import ggml
from ggserve.models import blocks
from ggserve.models.decoder import AFTER_NORM, Decoder
from ggserve.models.hparams import HParams
from ggserve.models.memory import LayerKV, LayerRecurrent, equal_blocks
from ggserve.models.registry import register
from ggserve.models.weights import Weights

F32 = 4     # bytes


class Layer(blocks.Layer):
    def __init__(self, w: Weights, i: int, m: "Qwen35Model"):
        p = f"blk.{i}."
        self.recurrent = m.is_recurrent[i]
        self.attn_norm = w.get(p + "attn_norm.weight", (m.n_embd,))
        self.ffn_norm = w.get(p + "post_attention_norm.weight", (m.n_embd,))
        if self.recurrent:
            self.wqkv = w.get(p + "attn_qkv.weight", (m.n_embd, m.conv_dim))
            self.wz = w.get(p + "attn_gate.weight", (m.n_embd, m.value_dim))
            self.conv = w.get(p + "ssm_conv1d.weight", (m.d_conv, m.conv_dim))
            self.dt_bias = w.get(p + "ssm_dt.bias", (m.n_v_heads,))
            self.a = w.get(p + "ssm_a", (m.n_v_heads,))                  # -exp(A_log)
            m.load_gates(self, w, p)
            self.ssm_norm = w.get(p + "ssm_norm.weight", (m.head_v,))
            self.ssm_out = w.get(p + "ssm_out.weight", (m.value_dim, m.n_embd))
        else:
            n_q = m.head_dim * m.n_head
            self.wq = w.get(p + "attn_q.weight", (m.n_embd, 2 * n_q))    # query | gate, per head
            self.wk = w.get(p + "attn_k.weight", (m.n_embd, m.head_dim * m.n_head_kv))
            self.wv = w.get(p + "attn_v.weight", (m.n_embd, m.head_dim * m.n_head_kv))
            self.wo = w.get(p + "attn_output.weight", (n_q, m.n_embd))
            self.q_norm = w.get(p + "attn_q_norm.weight", (m.head_dim,))
            self.k_norm = w.get(p + "attn_k_norm.weight", (m.head_dim,))
        m.load_ffn(self, w, i)


@register("qwen35")
class Qwen35Model(Decoder):
    n_pos = 4           # M-RoPE: 4 positions per token (text: p, p, p, 0)
    pick_rows = AFTER_NORM

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-6)
        self.read_ffn_hparams(hp)
        self.n_rot = hp.get("rope.dimension_count", self.head_dim)
        self.read_rope_sections(hp)
        self.rope_base = hp.get("rope.freq_base", 10000.0)
        self.n_ctx_orig = hp.get("context_length", 0)
        self.kq_scale = hp.get("attention.scale", 0.0) or float(np.float32(1) / np.sqrt(np.float32(self.head_dim)))
        # gated delta net
        self.d_conv = hp.get("ssm.conv_kernel", required=True)
        self.d_inner = hp.get("ssm.inner_size", required=True)
        self.head_k = hp.get("ssm.state_size", required=True)
        self.n_k_heads = hp.get("ssm.group_count", required=True)
        self.n_v_heads = hp.get("ssm.time_step_rank", required=True)
        self.head_v = self.d_inner // self.n_v_heads
        self.key_dim = self.head_k * self.n_k_heads
        self.value_dim = self.head_v * self.n_v_heads
        self.conv_dim = 2 * self.key_dim + self.value_dim
        recurrent = hp.get("attention.recurrent_layers")
        if recurrent is None:
            interval = hp.get("full_attention_interval", 4)
            recurrent = [(i + 1) % interval != 0 for i in range(self.n_layer)]
        self.is_recurrent = [bool(r) for r in recurrent][: self.n_layer]

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        self.layers = [Layer(w, i, self) for i in range(self.n_layer)]

    def read_rope_sections(self, hp: HParams) -> None:
        """IMROPE's 4 position sections (Qwen3-Next: none, it rotates by NeoX rope)."""
        self.sections = tuple(int(s) for s in hp.get("rope.dimension_sections", required=True))[:4]

    def read_ffn_hparams(self, hp: HParams) -> None:
        """The FFN's hyperparameters beyond n_ff (none here; Qwen3.5-MoE: the experts')."""

    def memory_layers(self, device_of_layer) -> list:
        """Attention layers keep K/V per token; the others a conv state (the last
        d_conv - 1 inputs of each channel) and a delta-rule state per sequence."""
        n_kv = self.head_dim * self.n_head_kv
        conv_state = (self.d_conv - 1) * self.conv_dim
        ssm_state = self.head_v * self.head_v * self.n_v_heads
        return [LayerRecurrent((conv_state, ssm_state), device_of_layer(i)) if r else
                LayerKV(n_kv, n_kv, device_of_layer(i)) for i, r in enumerate(self.is_recurrent)]

    def attention(self, g, inp, il, L, h, temp):
        if L.recurrent:
            return self._delta_net(g, inp, il, L, h)
        return self._attention(g, inp, il, L, h)

    def load_gates(self, L: Layer, w: Weights, p: str) -> None:
        """The delta net's write-strength (beta) and decay (alpha) projections of a
        recurrent layer (prefix p); Qwen3-Next: one fused matrix."""
        L.w_beta = w.get(p + "ssm_beta.weight", (self.n_embd, self.n_v_heads))
        L.w_alpha = w.get(p + "ssm_alpha.weight", (self.n_embd, self.n_v_heads))

    def gates(self, g, inp, L: Layer, h):
        """-> (beta, alpha) before their activations, each [n_v_heads, n_tokens]."""
        return inp.mm(g, L.w_beta, h), inp.mm(g, L.w_alpha, h)

    def load_ffn(self, L: Layer, w: Weights, i: int) -> None:
        """The FFN's weights of layer i on L (a SwiGLU FFN; Qwen3.5-MoE: experts)."""
        L.load(w, i, blocks.ffn_weights(self, norm=None))

    def _attention(self, g, inp, il, L, h):
        n, d, n_head = inp.n_tokens, self.head_dim, self.n_head
        qg = inp.mm(g, L.wq, h)                                            # [2 * d * n_head, n]
        q = g.view(qg, (d, n_head, n), (2 * d * F32, qg.nb[1]), 0)
        gate = g.reshape(g.cont(g.view(qg, (d, n_head, n), (2 * d * F32, qg.nb[1]), d * F32)), d * n_head, n)
        q = g.mul(g.rms_norm(q, self.eps), L.q_norm)
        k = g.reshape(inp.mm(g, L.wk, h), d, self.n_head_kv, n)
        k = g.mul(g.rms_norm(k, self.eps), L.k_norm)
        v = g.reshape(inp.mm(g, L.wv, h), d, self.n_head_kv, n)
        q = self._rope(g, q, inp.positions)
        k = self._rope(g, k, inp.positions)
        a = inp.kv.attention(g, il, q, k, v, self.kq_scale)               # [d * n_head, n]
        a = g.mul(a, g.sigmoid(gate))
        return inp.mm(g, L.wo, a)

    def _rope(self, g, t, pos):
        return g.rope_multi(t, pos, self.n_rot, self.sections, ggml.ROPE_IMROPE, self.n_ctx_orig, self.rope_base)

    def _delta_net(self, g, inp, il, L, h):
        n = inp.n_tokens
        qkv = inp.mm(g, L.wqkv, h)                                         # [conv_dim, n]
        z = inp.mm(g, L.wz, h)                                             # [value_dim, n]
        beta, alpha = self.gates(g, inp, L, h)
        beta = g.sigmoid(beta)                                             # [n_v_heads, n]
        decay = g.mul(g.softplus(g.add(alpha, L.dt_bias)), L.a)           # [n_v_heads, n]
        conv_states = inp.recurrent.state(g, il, 0)                        # [(d_conv - 1) * conv_dim, n_seqs]
        ssm_states = inp.recurrent.state(g, il, 1)                         # [head_v^2 * n_v_heads, n_seqs]
        outs, new_conv, new_ssm = [], [], []
        # one delta-net call per run of sequences with as many rows each (llama.cpp's equal split)
        for r0, nt, s0, ns in equal_blocks(inp.seq_rows):
            o, conv, ssm = self._delta_net_block(g, L, qkv, beta, decay, conv_states, ssm_states, r0, nt, s0, ns)
            outs.append(o)
            new_conv.append(conv)
            new_ssm.append(ssm)
        inp.recurrent.store(g, il, 0, _join(g, new_conv))
        inp.recurrent.store(g, il, 1, _join(g, new_ssm))
        o = g.reshape(_join(g, outs), self.head_v, self.n_v_heads, n)
        o = g.mul(g.mul(g.rms_norm(o, self.eps), L.ssm_norm), g.silu(g.reshape(z, self.head_v, self.n_v_heads, n)))
        return inp.mm(g, L.ssm_out, g.reshape(o, self.value_dim, n))

    def _delta_net_block(self, g, L, qkv, beta, decay, conv_states, ssm_states, r0, nt, s0, ns):
        """ns sequences of nt rows each, from batch row r0 and state row s0
        -> (output [value_dim, nt * ns], conv states, delta-rule states [size, ns])."""
        S, hv, n_k, n_v = self.head_k, self.head_v, self.n_k_heads, self.n_v_heads
        k_conv = self.d_conv - 1
        x = g.view(qkv, (self.conv_dim, nt, ns), (qkv.nb[1], qkv.nb[1] * nt), r0 * qkv.nb[1])
        prev = g.view(conv_states, (k_conv, self.conv_dim, ns), (k_conv * F32, conv_states.nb[1]),
                      s0 * conv_states.nb[1])
        conv_in = g.concat(prev, g.transpose(x), 0)                        # [d_conv - 1 + nt, conv_dim, ns]
        conv_next = g.view(conv_in, (k_conv, self.conv_dim, ns), (conv_in.nb[1], conv_in.nb[2]), nt * F32)
        c = g.silu(g.ssm_conv(conv_in, L.conv))                            # [conv_dim, nt, ns]
        q = g.view(c, (S, n_k, nt, ns), (S * F32, c.nb[1], c.nb[2]), 0)
        k = g.view(c, (S, n_k, nt, ns), (S * F32, c.nb[1], c.nb[2]), self.key_dim * F32)
        v = g.view(c, (hv, n_v, nt, ns), (hv * F32, c.nb[1], c.nb[2]), 2 * self.key_dim * F32)
        q, k = self.qk_heads(g, self._l2_norm(g, q), self._l2_norm(g, k))
        gd = g.view(decay, (1, n_v, nt, ns), (F32, n_v * F32, n_v * nt * F32), r0 * n_v * F32)
        gb = g.view(beta, (1, n_v, nt, ns), (F32, n_v * F32, n_v * nt * F32), r0 * n_v * F32)
        state = g.view(ssm_states, (hv, hv, n_v, ns), (hv * F32, hv * hv * F32, ssm_states.nb[1]),
                       s0 * ssm_states.nb[1])
        res = g.gated_delta_net(q, k, v, gd, gb, state)
        rows = nt * ns
        out = g.view(res, (self.value_dim, rows), (self.value_dim * F32,), 0)
        ssm_next = g.view(res, (hv * hv * n_v, ns), (hv * hv * n_v * F32,), self.value_dim * rows * F32)
        return out, g.reshape(g.cont(conv_next), k_conv * self.conv_dim, ns), ssm_next

    def qk_heads(self, g, q, k):
        """q, k [S, n_k_heads, nt, ns] as the delta-net op takes them (Qwen3.5: as they
        are, the op shares each k-head among the value heads; Qwen3-Next: repeated)."""
        return q, k

    def _l2_norm(self, g, t):
        """llama.cpp's build_gdn_l2_norm: x / ||x|| as an RMS norm scaled by 1/sqrt(n)."""
        n = t.ne[0]
        return g.scale(g.rms_norm(t, float(np.float32(self.eps) / np.float32(n))),
                       float(np.float32(1) / np.sqrt(np.float32(n))))


def _join(g, parts):
    """Concatenate 2-D tensors along their columns (one part: as it is)."""
    out = parts[0]
    for p in parts[1:]:
        out = g.concat(out, p, 1)
    return out
