"""The decoder-only transformer most architectures are: embeddings, pre-norm
residual layers (attention, then FFN), final norm, LM head.

An architecture subclasses `Decoder`, reads its hyperparameters and declares its
layers' weights (models/blocks.py) in __init__, and overrides only what its
llama.cpp graph does differently: rope(), scale_q(), qkv(), ffn(), layer(),
head(). Options read by the shared steps:

  pick_rows     where the rows whose outputs are wanted are picked: in the last
                layer before its residual add (LAST_LAYER, llama.cpp's usual
                inp_out_ids), after the layers (BEFORE_NORM) or after the final norm
                (AFTER_NORM)
  embd_scale    token embeddings scaled by it (None: not scaled)
  q_scale       queries scaled by it after rope (None: not scaled; kq_scale then 1)
  temperature   (scale, floor, offset) of llama.cpp's attention temperature input
                (attn_temp, one f32 per token); None: none
  swa_layers    per layer: sliding-window (`window`) or chunked (`chunk`) attention
"""
from __future__ import annotations

from ggserve.models import blocks
from ggserve.models.memory import LayerKV
from ggserve.native import ggml

LAST_LAYER, BEFORE_NORM, AFTER_NORM = "last_layer", "before_norm", "after_norm"
ATTN_TEMP = "attn_temp"


class Decoder:
    rope_type = ggml.ROPE_NORMAL
    pick_rows = LAST_LAYER
    embd_scale = None
    q_scale = None
    temperature = None
    attn_softcap = 0.0          # Gemma 2: attention logits softcapped (cap * tanh(x / cap))
    swa_layers = None
    window = 0
    chunk = 0
    window_cache = False        # sliding-window layers in llama.cpp's window + ubatch ring (LayerKV)

    def memory_layers(self, device_of_layer) -> list[LayerKV]:
        n = self.head_dim * self.n_head_kv
        swa = self.swa_layers or [False] * self.n_layer
        ring = self.window_cache and bool(self.window) and not self.chunk
        return [LayerKV(n, n, device_of_layer(il), self.window if swa[il] else 0, self.chunk if swa[il] else 0,
                        window_cache=ring and swa[il])
                for il in range(self.n_layer)]

    def step_values(self, positions):
        """Per-step graph inputs beside the tokens, from the batch's positions [n_pos, n_tokens]."""
        if self.temperature is None:
            return {}
        return {ATTN_TEMP: blocks.attention_temperature(positions[0], *self.temperature)}

    def forward(self, g, inp):
        """-> logits [n_vocab, n_outputs]."""
        temp = g.input(ATTN_TEMP, ggml.F32, (1, 1, inp.n_tokens)) if self.temperature is not None else None
        x = inp.embed(g, self.tok_embd, self.embd_scale)                 # [n_embd, n_tokens]
        for il, L in enumerate(self.layers):
            x = self.layer(g, inp, il, L, x, temp)
            if inp.control and il in inp.control:      # llama.cpp's build_cvec after each layer
                x = g.add(x, inp.control[il])
        return self.head(g, inp, x)

    def layer(self, g, inp, il, L, x, temp):
        """One pre-norm residual layer: x [n_embd, n_tokens] -> the next layer's input."""
        x = self.ffn_block(g, inp, il, L, self.attention_block(g, inp, il, L, x, temp))
        return x if L.out_scale is None else g.mul(x, L.out_scale)

    def attention_block(self, g, inp, il, L, x, temp):
        """x + attention(attn_norm(x)) (the wanted rows only, after the last layer's attention)."""
        a = self.attention(g, inp, il, L, blocks.pre_norm(g, x, L.attn_norm, self.eps), temp)
        if self.pick_rows == LAST_LAYER and il == self.n_layer - 1 and inp.out_ids is not None:
            a = g.get_rows(a, inp.out_ids)
            x = g.get_rows(x, inp.out_ids)
        if L.attn_post_norm is not None:
            a = blocks.norm(g, a, L.attn_post_norm, self.eps)
        return g.add(a, x)

    def ffn_block(self, g, inp, il, L, x):
        """x + ffn(ffn_norm(x))."""
        h = self.ffn(g, inp, il, L, blocks.pre_norm(g, x, L.ffn_norm, self.eps))
        if L.ffn_post_norm is not None:
            h = blocks.norm(g, h, L.ffn_post_norm, self.eps)
        return g.add(h, x)

    def attention(self, g, inp, il, L, h, temp):
        """Normed h [n_embd, n_tokens] -> attention through attn_output [n_embd, n_tokens]:
        projections, per-head q/k norms (when the layer has them), rope, the cache's attention."""
        q, k, v = self.qkv(g, inp, il, L, h)
        if L.q_norm is not None:
            q = blocks.norm(g, q, L.q_norm, self.eps)
            k = blocks.norm(g, k, L.k_norm, self.eps)
        q = self.scale_q(g, il, self.rope(g, il, q, inp.positions), temp)
        k = self.rope(g, il, k, inp.positions)
        a = inp.kv.attention(g, il, q, k, v, self.kq_scale, self.attn_softcap, sinks=L.sinks)
        return blocks.linear(g, inp, L.wo, L.bo, a)

    def qkv(self, g, inp, il, L, h):
        return blocks.qkv(g, inp, L, h, self.head_dim, self.n_head, self.n_head_kv)

    def rope(self, g, il, t, pos):
        """t [head_dim, n_head, n_tokens] rotated by the positions pos (layer il's rope)."""
        raise NotImplementedError

    def shift_k(self, g, il, k, shift):
        """Cached keys [head_dim, n_head_kv, n] moved by `shift` positions (i32 [n]): llama.cpp's
        K-shift after a context shift, with layer il's rope parameters. llama.cpp shifts every
        layer (its rope_pattern is all ones but for Granite's), so a model whose forward leaves
        some layers unrotated overrides this to rotate them all the same."""
        return self.rope(g, il, k, shift)

    def scale_q(self, g, il, q, temp):
        """Queries after rope: times the attention temperature, then q_scale."""
        if temp is not None:
            q = g.mul(q, temp)
        return q if self.q_scale is None else g.scale(q, self.q_scale)

    def ffn(self, g, inp, il, L, h):
        return blocks.swiglu_ffn(g, inp, L, h)

    def head(self, g, inp, x):
        """The final norm and the LM head -> logits [n_vocab, n_outputs]."""
        if self.pick_rows == BEFORE_NORM and inp.out_ids is not None:
            x = g.get_rows(x, inp.out_ids)
        x = blocks.norm(g, x, self.output_norm, self.eps)
        if self.pick_rows == AFTER_NORM and inp.out_ids is not None:
            x = g.get_rows(x, inp.out_ids)
        return inp.head(g, self.output, x)
