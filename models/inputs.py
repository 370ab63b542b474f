"""What a model's forward pass receives for one batch (graph-side tensors)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ForwardInputs:
    tokens: object          # i32 [n_token_rows]: ids of the batch rows that are tokens (None: none)
    positions: object       # i32 [n_tokens]
    out_ids: object | None  # i32 [n_outputs]: rows whose logits are wanted (None: all)
    kv: object              # KVStep: cache slots, masks, attention
    n_tokens: int
    images: object | None = None   # f32 [n_embd, n_image_rows]: image embedding rows of the batch
    order: object | None = None    # i32 [n_tokens]: batch row -> row of concat(token rows, image rows)

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
