"""DeepSeek V2 / V3 / R1 and Kimi K2 text models (GGUF arch `deepseek2`): multi-head
latent attention (MLA) over a compressed KV cache, and DeepSeek's MoE.

ref: llama.cpp src/models/deepseek2.cpp (the absorbed-MLA path, taken when the file
has `attention.key_length_mla`) and build_attn's K-only cache. Per token the cache
keeps one row: the RMS-normed compressed KV (`kv_lora_rank` values) then the roped
shared key part (`rope.dimension_count`, NORM rope); V is the compressed part of
that row (no V storage). Queries are absorbed into the compressed space: the
no-rope part of each head times `attn_k_b`, then the roped part appended; the
attention output is taken back to each head's values by `attn_v_b`. YaRN's
magnitude factor is moved out of the rope op into kq_scale (mscale^2 / sqrt(d)).
The first `leading_dense_block_count` layers have a dense FFN, the others a MoE
(llama.cpp's build_moe_ffn, expert groups included) plus shared experts.
"""
from __future__ import annotations

import math

import numpy as np

from ggserve.models import blocks, moe
from ggserve.models.decoder import Decoder
from ggserve.models.hparams import HParams
from ggserve.models.memory import LayerKV
from ggserve.models.registry import ModelError, register
from ggserve.models.rope import RopeScaling
from ggserve.models.weights import Weights
from ggserve.native import ggml

LOG_MUL_KEY = "rope.scaling.yarn_log_multiplier"


def _rope_hparams(meta: dict, path: str) -> HParams:
    """The converter stores 0.1 * mscale_all_dim as the YaRN log multiplier; llama.cpp
    divides it by 0.1 on load (TAG_DEEPSEEK2_YARN_LOG_MUL_FIX), in float32."""
    hp = HParams(meta, path)
    log_mul = hp.get(LOG_MUL_KEY, 0.0)
    if not log_mul:
        return hp
    fixed = dict(meta)
    fixed[f"{hp.arch}.{LOG_MUL_KEY}"] = float(np.float32(log_mul) / np.float32(0.1))
    return HParams(fixed, path)


@register("deepseek2")
class DeepSeek2Model(Decoder):
    rope_type = ggml.ROPE_NORMAL

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        hp.read_transformer(self, 1e-6)
        self.d_k = hp.get("attention.key_length_mla", 0)        # per head, as MHA: no-rope + rope
        self.d_v = hp.get("attention.value_length_mla", 0)
        if not self.d_k or not self.d_v:
            raise ModelError(f"{path}: deepseek2 without attention.key_length_mla/value_length_mla (MLA "
                             "not absorbed: an older conversion) is not supported; convert the model again")
        if hp.get("attention.temperature_scale", 0.0):
            raise ModelError(f"{path}: deepseek2 with attention.temperature_scale is not supported")
        self.n_rot = hp.get("rope.dimension_count", required=True)
        self.n_nope = self.d_k - self.n_rot
        self.kv_lora = hp.get("attention.kv_lora_rank", required=True)
        q_lora = hp.get("attention.q_lora_rank", 0)
        self.routing = moe.Routing.from_hparams(hp, path, moe.GATING_SOFTMAX)       # V2 files name no gating: softmax
        self.n_ff_exp = hp.get("expert_feed_forward_length", required=True)
        n_shared = hp.get("expert_shared_count", 0)
        n_dense = hp.get("leading_dense_block_count", 0)
        self.rope_scaling = RopeScaling.from_hparams(_rope_hparams(meta, path))
        self.kq_scale = self._kq_scale(hp)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        e, h, r = self.n_embd, self.n_head, self.kv_lora
        if q_lora:
            q_rows = [("wq_a", "attn_q_a.weight", (e, q_lora), True),
                      ("q_a_norm", "attn_q_a_norm.weight", (q_lora,), True),
                      ("wq_b", "attn_q_b.weight", (q_lora, h * self.d_k), True)]
        else:                                                            # V2-Lite
            q_rows = [("wq", "attn_q.weight", (e, h * self.d_k), True)]
        attn = [("attn_norm", "attn_norm.weight", (e,), True),
                ("wkv_a", "attn_kv_a_mqa.weight", (e, r + self.n_rot), True),
                ("kv_a_norm", "attn_kv_a_norm.weight", (r,), True),
                ("wk_b", "attn_k_b.weight", (self.n_nope, r, h), True),
                ("wv_b", "attn_v_b.weight", (r, self.d_v, h), True),
                ("wo", "attn_output.weight", (h * self.d_v, e), True),
                ("ffn_norm", "ffn_norm.weight", (e,), True)]
        self.layers = []
        for i in range(self.n_layer):
            L = blocks.Layer(w, i, q_rows, attn)
            if i < n_dense:
                L.load(w, i, blocks.ffn_weights(self, norm=None))
                L.shared = False
            else:
                L.experts = moe.Experts(w, i, e, self.n_ff_exp, self.routing.n_expert)
                L.experts.probs_b = w.get(f"blk.{i}.exp_probs_b.bias", (self.routing.n_expert,), required=False)
                L.shared = n_shared > 0
                if L.shared:
                    L.load(w, i, blocks.ffn_weights(self, self.n_ff_exp * n_shared, norm=None, suffix="_shexp"))
            self.layers.append(L)

    def _kq_scale(self, hp: HParams) -> float:
        """llama.cpp's pre-scaled kq_scale: the rope's attn_factor times YaRN's own
        magnitude factor (which the rope op applies and attn_factor cancels), times the
        log-multiplier's mscale, squared, over sqrt(d_k); in float32 as llama.cpp."""
        f32 = np.float32
        rs = self.rope_scaling
        log_f = f32(math.log(f32(1.0) / f32(rs.freq_scale)))
        attn_org = f32(rs.attn_factor) * (f32(1.0) + f32(0.1) * log_f)
        log_mul = _rope_hparams(hp.meta, hp.path).get(LOG_MUL_KEY, 0.0)
        mscale = attn_org * (f32(1.0) + f32(0.1) * f32(log_mul) * log_f)
        return float(f32(1.0) * mscale * mscale / f32(math.sqrt(f32(self.d_k))))

    def memory_layers(self, device_of_layer) -> list[LayerKV]:
        """One compressed row per token (kv_lora_rank + rope dims); V is its first
        kv_lora_rank values."""
        n = self.kv_lora + self.n_rot
        return [LayerKV(n, self.kv_lora, device_of_layer(il), v_in_k=True) for il in range(self.n_layer)]

    def rope(self, g, il, t, pos):
        return self.rope_scaling.apply(g, t, pos, self.n_rot, self.rope_type)

    def k_rope_span(self, il):
        """(first value, values) of a cached row that carry the rope: the tail after the compressed KV."""
        return self.kv_lora, self.n_rot

    def attention(self, g, inp, il, L, h, temp):
        """Absorbed MLA: normed h [n_embd, n_tokens] -> attn_output [n_embd, n_tokens]."""
        n, H, r, rot, nope = inp.n_tokens, self.n_head, self.kv_lora, self.n_rot, self.n_nope
        if getattr(L, "wq_a", None) is not None:
            q = inp.mm(g, L.wq_b, blocks.norm(g, inp.mm(g, L.wq_a, h), L.q_a_norm, self.eps))
        else:
            q = inp.mm(g, L.wq, h)                                      # [d_k * H, n]
        es = q.nb[0]
        q_nope = g.view(q, (nope, H, n), (self.d_k * es, self.d_k * H * es), 0)
        q_pe = g.view(q, (rot, H, n), (self.d_k * es, self.d_k * H * es), nope * es)
        kv = inp.mm(g, L.wkv_a, h)                                      # [r + rot, n]
        kv_cmpr = g.view(kv, (r, n), ((r + rot) * es,), 0)
        k_pe = g.view(kv, (rot, 1, n), ((r + rot) * es, (r + rot) * es), r * es)
        q_pe = self.rope(g, il, q_pe, inp.positions)
        k_pe = self.rope(g, il, k_pe, inp.positions)
        kv_cmpr = blocks.norm(g, kv_cmpr, L.kv_a_norm, self.eps)
        # each head's no-rope query taken into the compressed space: [r, n, H] -> [r, H, n]
        q_abs = g.permute(g.mul_mat(L.wk_b, g.permute(q_nope, 0, 2, 1, 3)), 0, 2, 1, 3)
        q = g.concat(q_abs, q_pe, 0)                                    # [r + rot, H, n]
        v = g.reshape(kv_cmpr, r, 1, n)
        k = g.concat(v, k_pe, 0)                                        # [r + rot, 1, n]
        a = g.reshape(inp.kv.attention(g, il, q, k, v, self.kq_scale), r, H, n)
        # back to each head's values: [r, n, H] x attn_v_b -> [d_v, n, H] -> [d_v, H, n]
        a = g.cont(g.permute(g.mul_mat(L.wv_b, g.permute(a, 0, 2, 1, 3)), 0, 2, 1, 3))
        return inp.mm(g, L.wo, g.reshape(a, self.d_v * H, n))

    def ffn(self, g, inp, il, L, h):
        if L.experts is None:
            return blocks.swiglu_ffn(g, inp, L, h)
        out = moe.moe_ffn(g, inp, h, L.experts, self.routing)
        return g.add(out, blocks.swiglu_ffn(g, inp, L, h)) if L.shared else out
