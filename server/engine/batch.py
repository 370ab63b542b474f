"""A step plan's chunks as one batch of rows: plain arrays, no tensors."""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np


@dataclass
class Batch:
    chunks: tuple                 # the plan's chunks, in row order
    tokens: np.ndarray            # int64 [n]: token ids (negative: image rows)
    positions: np.ndarray         # int32 [n_pos, n]
    seq_ids: np.ndarray           # int64 [n]: each row's slot
    out_rows: np.ndarray          # int32: rows whose logits are sampled: a chunk's last, or all of a drafted one
    out_chunks: list              # the chunks those rows belong to (once per chunk)
    images: list | None           # (batch row, embedding buffer, first row, end row) blocks, in batch order
    span_ids: np.ndarray | None   # int64 [n]: non-zero for rows of bidirectional spans (the mask)
    # rows whose final hidden state an embedding's pooling reads (server/engine/pooling.py), and
    # (chunk, how many of those rows) per embedding chunk, in row order
    hidden_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    hidden_chunks: list = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.tokens)

    def per_sequence(self) -> tuple[list[int], list[int]]:
        """(slots, row counts), one per chunk."""
        return [c.seq.slot for c in self.chunks], [c.n for c in self.chunks]

    def seq_rows(self) -> tuple[tuple[int, int], ...]:
        """(first row, rows) per sequence, in batch order: one chunk per sequence, its rows together."""
        starts = accumulate((c.n for c in self.chunks[:-1]), initial=0)     # (numpy's cumsum costs more here)
        return tuple((r, c.n) for r, c in zip(starts, self.chunks))


def assemble(chunks, images, n_pos: int) -> Batch:
    """images: the image store (every tile the chunks reach is in it: the plan saw to that)."""
    tokens = np.concatenate([np.asarray(c.seq.tokens[c.start:c.start + c.n - len(c.draft)] + list(c.draft),
                                        dtype=np.int64) for c in chunks])
    if n_pos == 1:
        positions = np.concatenate([np.arange(c.start, c.start + c.n, dtype=np.int32) for c in chunks])[None, :]
    else:
        positions = np.concatenate([_positions(c.seq, c.start, c.n, n_pos) for c in chunks], axis=1)
    seq_ids = np.concatenate([np.full(c.n, c.seq.slot, dtype=np.int64) for c in chunks])
    out_rows, out_chunks, hidden, hidden_chunks, row = [], [], [], [], 0
    for c in chunks:
        if c.seq.pool is not None:          # an embedding: hidden states, never logits
            rows = c.seq.pool.rows(c.start, c.n)
            if len(rows):
                hidden.append(row + rows)
                hidden_chunks.append((c, len(rows)))
        elif c.draft:                       # every row of a drafted chunk is verified
            out_rows.extend(range(row, row + c.n))
            out_chunks.append(c)
        elif c.wants_logits:
            out_rows.append(row + c.n - 1)
            out_chunks.append(c)
        row += c.n
    blocks, span_ids = _image_rows(chunks, len(tokens), images)
    hidden_rows = np.concatenate(hidden).astype(np.int32) if hidden else np.zeros(0, np.int32)
    return Batch(tuple(chunks), tokens, positions, seq_ids, np.asarray(out_rows, dtype=np.int32), out_chunks,
                 blocks, span_ids, hidden_rows, hidden_chunks)


def _positions(seq, start: int, n: int, n_pos: int) -> np.ndarray:
    """int32 [n_pos, n]. A text prompt of an M-RoPE model (no positions given: each
    token's is its index p) gets llama.cpp's text positions (p, p, p, 0)."""
    p = seq.positions(start, n)
    if len(p) < n_pos:
        p = np.concatenate([np.repeat(p, n_pos - 1, axis=0), np.zeros((1, n), dtype=np.int32)])
    return p


def _image_rows(chunks, n, images):
    """The batch's image rows as (batch row, embedding buffer, first, end) blocks,
    and per-row span ids (non-zero for rows of bidirectional spans) for the mask."""
    blocks, span_ids, row = [], np.zeros(n, dtype=np.int64), 0
    for c in chunks:
        for span in c.seq.images:
            lo, hi = max(span.start, c.start), min(span.end, c.start + c.n)
            if lo >= hi:
                continue
            emb = images.get(span.key)
            # the block holds its buffer: evicted later in this step, it stays alive
            blocks.append((row + lo - c.start, emb, lo - span.start, hi - span.start))
            if span.bidirectional:
                # unique per (slot, image position): the cells of one image occurrence
                span_ids[row + lo - c.start: row + hi - c.start] = 1 + c.seq.slot * (1 << 40) + span.start
        row += c.n
    if not blocks:
        return None, None
    return sorted(blocks, key=lambda b: b[0]), span_ids
