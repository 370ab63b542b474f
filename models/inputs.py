"""What a model's forward pass receives for one batch (graph-side tensors)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ForwardInputs:
    tokens: object          # i32 [n_token_rows]: ids of the batch rows that are tokens (None: none)
    positions: object       # i32 [n_pos * n_tokens]: n_pos positions per token (1, or 4 for M-RoPE), dim-major
    out_ids: object | None  # i32 [n_outputs]: rows whose logits are wanted (None: all)
    kv: object              # models.memory.AttentionStep: cache slots, masks, attention
    n_tokens: int
    images: object | None = None   # f32 [n_embd, n_image_rows]: image embedding rows of the batch
    order: object | None = None    # i32 [n_tokens]: batch row -> row of concat(token rows, image rows)
    recurrent: object | None = None  # models.memory.RecurrentStep (hybrid models)
    # (first row, rows) per sequence of the batch, in batch order (each sequence's rows
    # are contiguous; `recurrent`'s states come in this order)
    seq_rows: tuple = ()
    kernel_of: dict | None = None   # weight -> "repack" | "tiled" | "sgemm" (others: absent)
    plans: dict | None = None       # kind -> row plan for this batch (server.kernel_parity.RowPlan)
    n_outputs: int = 0
    # i32 [n_logit_rows]: the output rows whose logits are wanted, when some output rows
    # want only their hidden state (embeddings); None: every output row's
    logit_rows: object | None = None
    hidden: object | None = None    # set by head(): f32 [n_embd, n_outputs], the final norm's output
    # LoRA adapters of the batch's rows: adapters.add(g, inputs, w, x, w @ x) adds their
    # products to a weight's (server/engine/adapter_step.py); None: no row uses one
    adapters: object | None = None
    control: dict | None = None     # layer -> f32 [n_embd] control vector added to its output

    def mm(self, g, w, x):
        """w @ x for a weight matrix (plus the rows' LoRA adapters of w); rows planned when
        w's kernel depends on the call."""
        kind = self.kernel_of.get(w) if self.kernel_of else None
        if kind is None or self.plans is None:
            y = g.mul_mat(w, x)
        else:
            y = self.plans[kind].apply(g, w, x, x.ne[1] == self.n_tokens)
        return y if self.adapters is None else self.adapters.add(g, self, w, x, y)

    def head(self, g, output, x):
        """Logits [n_vocab, n_logit_rows] of the final hidden state x [n_embd, n_outputs]
        (after the output norm). x is kept as `hidden`: embeddings pool it, as llama.cpp
        reads its t_embd (result_norm)."""
        self.hidden = x
        if self.logit_rows is not None:
            x = g.get_rows(x, self.logit_rows)
        return self.mm(g, output, x)

    def embed(self, g, tok_embd, scale: float | None = None):
        """Input embeddings [n_embd, n_tokens]: token rows looked up (and scaled, for models
        that scale them; image embeddings are never scaled), image rows as given."""
        if self.tokens is None:
            return self.images
        x = g.get_rows(tok_embd, self.tokens)
        if scale is not None:
            x = g.scale(x, scale)
        if self.images is None:
            return x
        return g.get_rows(g.concat(x, self.images, 1), self.order)
