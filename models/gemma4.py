"""Gemma 4 dense text models: sliding-window and global layers with their own head
sizes, KV head counts and rope, V normalized, logits soft-capped.

ref: llama.cpp src/models/gemma4.cpp. Layer kinds come from
`attention.sliding_window_pattern` (true: sliding window); sliding layers use
`key_length_swa` / `rope.dimension_count_swa` / `rope.freq_base_swa`, global ones
`key_length` / `rope.dimension_count` / `rope.freq_base` with the proportional-rope
factors `rope_freqs.weight`. A layer without `attn_v` uses its K projection as V
(before the norms). q and k are RMS-normed with weights, v without; attention
scale 1; post-attention and post-FFN norms; GELU FFN; each layer's output times
`layer_output_scale`; embeddings scaled by sqrt(n_embd); final logits soft-capped.
E2B/E4B: per-layer embeddings (models/gemma4e.py) mixed in before the output scale, and
the last `attention.shared_kv_layers` layers project no K/V: they attend over the
cache of the last earlier layer of their kind, which holds nothing for them.
Not here: MoE layers (26B-A4B): such files are refused at load.
"""
from __future__ import annotations

import math

import numpy as np

from ggserve.models import blocks
from ggserve.models.decoder import AFTER_NORM, Decoder
from ggserve.models.gemma4e import PerLayerEmbeddings, shared_kv_sources
from ggserve.models.hparams import HParams
from ggserve.models.memory import LayerKV
from ggserve.models.registry import ModelError, register
from ggserve.models.weights import Weights
from ggserve.native import ggml


def _per_layer(value, n_layer: int) -> list[int]:
    """A GGUF key that is a scalar or an array with one value per layer."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return [int(x) for x in value]
    return [int(value)] * n_layer


@register("gemma4")
class Gemma4Model(Decoder):
    rope_type = ggml.ROPE_NEOX
    pick_rows = AFTER_NORM
    kq_scale = 1.0

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        hp = HParams(meta, path)
        n = hp.get("block_count", required=True)
        self.arch = hp.arch
        self.n_layer = n
        self.n_embd = hp.get("embedding_length", required=True)
        self.n_head = _per_layer(hp.get("attention.head_count", required=True), n)
        self.n_head_kv = _per_layer(hp.get("attention.head_count_kv", self.n_head), n)
        self.n_ff = _per_layer(hp.get("feed_forward_length", required=True), n)
        self.eps = hp.get("attention.layer_norm_rms_epsilon", 1e-6)
        self.swa = [bool(x) for x in hp.get("attention.sliding_window_pattern", required=True)]
        self.window = hp.get("attention.sliding_window", required=True)
        full_dim = hp.get("attention.key_length", self.n_embd // self.n_head[0])
        swa_dim = hp.get("attention.key_length_swa", required=True)
        if hp.get("attention.value_length", full_dim) != full_dim or \
                hp.get("attention.value_length_swa", required=True) != swa_dim:
            raise ModelError(f"{path}: Gemma 4 needs equal key and value head sizes")
        self.head_dim = [swa_dim if s else full_dim for s in self.swa]
        self.n_rot = [hp.get("rope.dimension_count_swa", swa_dim) if s else hp.get("rope.dimension_count", full_dim)
                      for s in self.swa]
        self.rope_base = [hp.get("rope.freq_base_swa", 10000.0) if s else hp.get("rope.freq_base", 10000.0)
                          for s in self.swa]
        self.n_ctx_orig = hp.get("context_length", 0)
        self.embd_scale = math.sqrt(self.n_embd)
        self.softcap = hp.get("final_logit_softcapping", 0.0)
        if hp.get("expert_count", 0):
            raise ModelError(f"{path}: Gemma 4 with {self.arch}.expert_count = {hp.get('expert_count')} is not "
                             "supported (MoE layers are not implemented)")
        if len(self.swa) != n:
            raise ModelError(f"{path}: attention.sliding_window_pattern has {len(self.swa)} entries for {n} layers")
        self.kv_from = shared_kv_sources(self.swa, hp.get("attention.shared_kv_layers", 0), path)

        w = Weights(tensors, path)
        w.embeddings_and_output(self)
        n_ple = hp.get("embedding_length_per_layer_input", 0)
        self.per_layer = PerLayerEmbeddings(w, self.n_embd, n_ple, n, self.eps) if n_ple else None
        self.rope_freqs = w.get("rope_freqs.weight", (full_dim // 2,), required=not all(self.swa))
        self.layers = [blocks.Layer(w, i, self._attention_weights(i), blocks.ffn_weights(self, self.n_ff[i]),
                                    blocks.post_norm_weights(self),
                                    [("out_scale", "layer_output_scale.weight", (1,), False)],
                                    self.per_layer.weights() if self.per_layer else [])
                       for i in range(n)]

    def _attention_weights(self, il: int) -> list:
        """A layer reading another layer's K/V needs no K projection or K norm."""
        rows = blocks.attention_weights(self, qk_norm=True, v_required=False, head_dim=self.head_dim[il],
                                        n_head=self.n_head[il], n_head_kv=self.n_head_kv[il])
        if self.kv_from[il] == il:
            return rows
        return [(a, name, shape, req and a not in ("wk", "k_norm")) for a, name, shape, req in rows]

    def memory_layers(self, device_of_layer) -> list[LayerKV]:
        """A shared layer reads the cache of the layer it names; sliding-window layers in
        a window + ubatch ring (llama.cpp's iSWA cache)."""
        def spec(il):
            src = self.kv_from[il]
            n = self.head_dim[src] * self.n_head_kv[src]
            return LayerKV(n, n, device_of_layer(src), self.window if self.swa[il] else 0,
                           kv_from=-1 if src == il else src, window_cache=self.swa[il])
        return [spec(il) for il in range(self.n_layer)]

    def forward(self, g, inp):
        """-> logits [n_vocab, n_outputs]; Decoder's, with the per-layer inputs mixed in."""
        x = inp.embed(g, self.tok_embd, self.embd_scale)                 # [n_embd, n_tokens]
        per_layer = self.per_layer.inputs(g, inp, x) if self.per_layer else None
        for il, L in enumerate(self.layers):
            x = self.ffn_block(g, inp, il, L, self.attention_block(g, inp, il, L, x, None))
            if per_layer is not None:
                x = self.per_layer.mix(g, inp, il, L, x, per_layer)
            if L.out_scale is not None:
                x = g.mul(x, L.out_scale)
        return self.head(g, inp, x)

    def attention(self, g, inp, il, L, h, temp):
        """q (and k, v unless the layer reads another layer's) normed and roped, the cache's attention."""
        if self.kv_from[il] == il:
            return super().attention(g, inp, il, L, h, temp)
        q = g.reshape(inp.mm(g, L.wq, h), self.head_dim[il], self.n_head[il], inp.n_tokens)
        q = self.rope(g, il, blocks.norm(g, q, L.q_norm, self.eps), inp.positions)
        return blocks.linear(g, inp, L.wo, L.bo, inp.kv.attention(g, il, q, None, None, self.kq_scale))

    def qkv(self, g, inp, il, L, h):
        """A layer's own head sizes; V is the K projection when attn_v is absent, and RMS-normed."""
        d, n_head_kv, n = self.head_dim[il], self.n_head_kv[il], inp.n_tokens
        q = g.reshape(inp.mm(g, L.wq, h), d, self.n_head[il], n)
        k = inp.mm(g, L.wk, h)
        v = inp.mm(g, L.wv, h) if L.wv is not None else k
        return q, g.reshape(k, d, n_head_kv, n), g.rms_norm(g.reshape(v, d, n_head_kv, n), self.eps)

    def rope(self, g, il, t, pos):
        factors = None if self.swa[il] else self.rope_freqs
        return g.rope(t, pos, self.n_rot[il], self.rope_type, self.n_ctx_orig, self.rope_base[il], 1.0,
                      0.0, 1.0, 32.0, 1.0, factors)

    def ffn(self, g, inp, il, L, h):
        return blocks.geglu_ffn(g, inp, L, h)

    def head(self, g, inp, x):
        logits = super().head(g, inp, x)
        if self.softcap:
            logits = g.scale(g.tanh(g.scale(logits, 1.0 / self.softcap)), self.softcap)
        return logits
