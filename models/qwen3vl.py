"""Qwen3-VL text models: Qwen3 blocks (q/k RMS norms) with interleaved M-RoPE and deepstack.

ref: llama.cpp src/models/qwen3vl.cpp. Positions as qwen2vl.py (4 per token), rotated
with GGML_ROPE_TYPE_IMROPE (sections interleaved over the pairs). The input rows are
n_embd * (1 + n_deepstack) wide: slice 0 is the embedding the first layer reads,
slice k is added to the output of layer k - 1. Image rows carry all slices (the
qwen3vl projector writes them); token rows are zero beyond slice 0, as llama.cpp
pads them (build_inp_embd), so adding their slices changes nothing.
"""
from __future__ import annotations

from ggserve.native import ggml
from ggserve.models.hparams import HParams
from ggserve.models.qwen3 import Qwen3Model
from ggserve.models.registry import register

F32 = 4


@register("qwen3vl")
class Qwen3VLModel(Qwen3Model):
    n_pos = 4

    def __init__(self, meta: dict, tensors: dict, path: str = ""):
        super().__init__(meta, tensors, path)
        hp = HParams(meta, path)
        self.sections = tuple(int(s) for s in hp.get("rope.dimension_sections", required=True))[:4]
        self.n_deepstack = int(hp.get("n_deepstack_layers", 0))
        self.n_embd_inp = self.n_embd * (1 + self.n_deepstack)   # what an image row must carry

    def _rope(self, g, t, pos):
        return g.rope_multi(t, pos, self.head_dim, self.sections, ggml.ROPE_IMROPE, self.n_ctx_orig,
                            self.rope_base)

    def _embed(self, g, inp):
        """-> (x [n_embd, n_tokens], deepstack slices or None)."""
        if not self.n_deepstack or inp.images is None:
            return inp.embed(g, self.tok_embd), None
        e, n = self.n_embd, inp.n_tokens
        if inp.tokens is None:
            full = inp.images                                             # [n_embd_inp, n]
        else:
            tok = g.pad(g.get_rows(self.tok_embd, inp.tokens), self.n_embd_inp - e)
            full = g.get_rows(g.concat(tok, inp.images, 1), inp.order)
        slices = [g.view(full, (e, n), (full.nb[1],), k * e * F32) for k in range(1 + self.n_deepstack)]
        return slices[0], slices[1:]

    def forward(self, g, inp):
        """-> logits [n_vocab, n_outputs]: Qwen3's layers, each deepstack slice added
        after its layer (the wanted rows only after the last)."""
        x, deepstack = self._embed(g, inp)                                  # [n_embd, n_tokens]
        for il, L in enumerate(self.layers):
            x = self.layer(g, inp, il, L, x, None)
            if deepstack is not None and il < self.n_deepstack:
                ds = deepstack[il]
                last = il == self.n_layer - 1 and inp.out_ids is not None
                x = g.add(x, g.get_rows(ds, inp.out_ids) if last else ds)
        return self.head(g, inp, x)
