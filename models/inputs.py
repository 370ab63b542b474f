"""What a model's forward pass receives for one batch (graph-side tensors)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ForwardInputs:
    tokens: object          # i32 [n_tokens]
    positions: object       # i32 [n_tokens]
    out_ids: object | None  # i32 [n_outputs]: rows whose logits are wanted (None: all)
    kv: object              # KVStep: cache slots, masks, attention
    n_tokens: int
