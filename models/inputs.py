"""What a model's forward pass receives for one batch (graph-side tensors)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggserve.native import ggml


@dataclass
class ForwardInputs:
    tokens: object          # i32 [n_token_rows]: ids of the batch rows that are tokens (None: none)
    positions: object       # i32 [n_tokens]
    out_ids: object | None  # i32 [n_outputs]: rows whose logits are wanted (None: all)
    kv: object              # KVStep: cache slots, masks, attention
    n_tokens: int
    images: object | None = None   # f32 [n_embd, n_image_rows]: image embedding rows of the batch
    order: object | None = None    # i32 [n_tokens]: batch row -> row of concat(token rows, image rows)
    kernel_of: dict | None = None   # weight -> "repack" | "tiled" (others: absent)
    plans: dict | None = None       # kind -> RowPlan for this batch
    n_outputs: int = 0

    def mm(self, g, w, x):
        """w @ x for a weight matrix; rows planned when w's kernel depends on the call."""
        kind = self.kernel_of.get(w) if self.kernel_of else None
        if kind is None or self.plans is None:
            return g.mul_mat(w, x)
        return self.plans[kind].apply(g, w, x, x.ne[1] == self.n_tokens)

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


UBATCH = 512          # llama.cpp's default -ub: how it cuts a prompt into ubatches

# ggml's CPU mul_mat picks a kernel per call from its row count, and the kernels
# round differently:
# - weights repacked into interleaved layouts: rows in groups of four by gemm,
#   the last n % 4 rows one by one by gemv;
# - k-quant weights (not repacked): a tiled kernel for calls of >= 8 rows,
#   vec_dot below;
# - other types: the same per-row result whatever the call.
TILED_TYPES = {"q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_xs", "iq2_xxs", "iq2_xs",
               "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"}
MATMUL_TILED_MIN_ROWS = 8


CHECKPOINT_TAIL = 4   # llama-server's context checkpoints: the last 4 prompt tokens go alone


def solo_ubatches(positions: np.ndarray, n_prompt: int, image_spans=(), checkpoints: bool = False,
                  turn_starts=()):
    """For rows of one sequence at `positions`: (first position, row count) of the
    ubatch llama-server computes each in when the sequence runs alone.

    llama-server decodes a prompt chunk by chunk (text runs, and each image's
    embeddings through mtmd), and llama_decode cuts each chunk into UBATCH-row
    ubatches from its start. For models with a sliding window (`checkpoints`) it
    also ends a text batch CHECKPOINT_TAIL and CHECKPOINT_TAIL + UBATCH tokens
    before the prompt's end, and before user turns of a chat (`turn_starts`), to
    save context checkpoints there. Generated tokens come one per ubatch.
    """
    if positions.min(initial=n_prompt) >= n_prompt:        # decode rows only
        return positions.astype(np.int64), np.ones(len(positions), dtype=np.int64)
    cuts = {0, n_prompt}
    for span in image_spans:
        cuts.update((span.start, span.end))
    if checkpoints:
        in_image = lambda q: any(s.start <= q < s.end for s in image_spans)
        cuts.update(q for q in (n_prompt - CHECKPOINT_TAIL - UBATCH, n_prompt - CHECKPOINT_TAIL, *turn_starts)
                    if 0 < q < n_prompt and not in_image(q))
    bounds = np.array(sorted(cuts), dtype=np.int64)
    p = positions.astype(np.int64)
    seg = np.clip(np.searchsorted(bounds, p, side="right") - 1, 0, len(bounds) - 2)
    seg_start, seg_end = bounds[seg], bounds[seg + 1]
    start = seg_start + (p - seg_start) // UBATCH * UBATCH
    size = np.minimum(UBATCH, seg_end - start)
    generated = p >= n_prompt
    return np.where(generated, p, start), np.where(generated, 1, size)


def batched_rows(kind: str, positions: np.ndarray, ub_start: np.ndarray, ub_size: np.ndarray) -> np.ndarray:
    """Per row: does llama.cpp compute it with the many-row kernel of `kind`? In a
    k-row ubatch the first 4 * (k // 4) rows take gemm ("repack"); all k rows take
    the tiled kernel when k >= 8 ("tiled")."""
    if kind == "repack":
        return positions - ub_start < ub_size // 4 * 4
    return ub_size >= MATMUL_TILED_MIN_ROWS


class RowPlan:
    """How the rows of a batch meet one kind of weight so that each row gets the
    kernel llama.cpp gives it alone, whatever else shares the batch: rows that
    take the many-row kernel are gathered first (padded by repeating a row), the
    others follow in calls too small for it."""

    def __init__(self, kind: str, batched: np.ndarray, n_outputs: int):
        self.kind = kind
        n_tokens = len(batched)
        self.n_tokens = n_tokens
        solo_max = 3 if kind == "repack" else MATMUL_TILED_MIN_ROWS - 1
        many = np.flatnonzero(batched)
        few = np.flatnonzero(~batched)
        if len(many):
            pad = -len(many) % 4 if kind == "repack" else max(0, MATMUL_TILED_MIN_ROWS - len(many))
            many = np.concatenate([many, np.repeat(many[-1:], pad)])
            # gemm leaves the last n % 4 rows to gemv: up to three solo rows ride along
            first = len(many) + (min(solo_max, len(few)) if kind == "repack" else 0)
            self.calls = [(0, first)] + _chunks(first, len(many) + len(few), solo_max)
            self.perm = np.concatenate([many, few]).astype(np.int32)
            inv = np.empty(n_tokens, dtype=np.int32)
            inv[self.perm[::-1]] = np.arange(len(self.perm), dtype=np.int32)[::-1]   # first copy wins
            self.inv = inv
        else:
            self.calls = _chunks(0, n_tokens, solo_max)
            self.perm = self.inv = None
        # after the last layer keeps only the output rows, every row is a solo row
        self.out_calls = _chunks(0, n_outputs, solo_max)
        self.t_perm = self.t_inv = None

    @property
    def key(self) -> tuple:
        """What the graph built from this plan depends on (the rest are input values)."""
        return (self.kind, tuple(self.calls), None if self.perm is None else len(self.perm), tuple(self.out_calls))

    def values(self) -> dict[str, np.ndarray]:
        """The plan's graph inputs by name (declare() declares them)."""
        if self.perm is None:
            return {}
        return {f"mm_perm_{self.kind}": self.perm, f"mm_inv_{self.kind}": self.inv}

    def declare(self, g) -> None:
        if self.perm is not None:
            self.t_perm = g.input(f"mm_perm_{self.kind}", ggml.I32, (len(self.perm),))
            self.t_inv = g.input(f"mm_inv_{self.kind}", ggml.I32, (self.n_tokens,))

    def apply(self, g, w, x, full_batch: bool):
        calls = self.calls if full_batch else self.out_calls
        if len(calls) == 1 and (not full_batch or self.t_perm is None):
            return g.mul_mat(w, x)
        if full_batch and self.t_perm is not None:
            x = g.get_rows(x, self.t_perm)
        outs = [g.mul_mat(w, g.view(x, (x.ne[0], n), (x.nb[1],), r0 * x.nb[1])) for r0, n in calls]
        while len(outs) > 1:
            outs = [g.concat(outs[i], outs[i + 1], 1) if i + 1 < len(outs) else outs[i]
                    for i in range(0, len(outs), 2)]
        out = outs[0]
        if full_batch and self.t_inv is not None:
            out = g.get_rows(out, self.t_inv)
        return out


def _chunks(start: int, end: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(size, end - a)) for a in range(start, end, size)]
