"""Context shift (`--context-shift`, off by default as in llama-server 11434).

A sequence whose next decode would not fit its slot's context (n_past + 1 >=
n_ctx) keeps its BOS token (when the model adds one) and the request's first n_keep
tokens (`--keep`), and drops half of the rest, the oldest; the tokens after the dropped ones move back to
follow the kept ones, their keys re-rotated to their new positions. As llama-server
does it (tools/server/server-context.cpp, pre_decode: n_left = n_past - n_keep,
n_discard = n_left / 2, seq_rm then seq_add), so generation goes on past the
context with llama-server's tokens. Only for memory that can move (no recurrent
state, no sliding-window ring smaller than the cache, no M-RoPE, no images: llama-server
turns it off for those).
"""
from __future__ import annotations

from ggserve.server.engine.sequence import Sequence


def supported(model, memory, vision) -> bool:
    return hasattr(model, "shift_k") and memory.can_shift and vision is None and getattr(model, "n_pos", 1) == 1


def discard(n_past: int, n_ctx: int, n_keep: int) -> tuple[int, int]:
    """(n_keep, n_discard) of a shift at n_past tokens (llama-server's arithmetic)."""
    n_keep = min(n_ctx - 4, n_keep)
    n_left = n_past - n_keep
    return n_keep, max(0, min(n_left // 2, n_left - 1))


def shift(seq: Sequence, memory, model, n_ctx: int, n_bos: int) -> bool:
    """Shift seq's context if its next decode would not fit, keeping the request's n_keep
    tokens after the n_bos BOS tokens (-1: the whole prompt). -> False when it would
    not fit and memory cannot shift (the sequence ends as without context shift)."""
    n_past = seq.n_computed
    if seq.prefilling or seq.n_pending != 1 or n_past + 1 < n_ctx:
        return True
    n_keep = n_bos + (seq.n_prompt if seq.request.n_keep < 0 else seq.request.n_keep)
    n_keep, n_discard = discard(n_past, n_ctx, n_keep)
    if not memory.context_shift(seq.slot, n_keep, n_discard, n_past, model):
        return False
    seq.discard(n_keep, n_discard)
    return True
