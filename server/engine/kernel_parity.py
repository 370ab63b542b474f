"""llama.cpp's numbers, row for row: which ggml kernel computes each batch row.

ggml's CPU kernels are chosen per call from its shape, and they round differently.
llama-server runs each sequence alone, prompt cut into ubatches; ggserve batches
many sequences together, chunks prompts its own way and reuses prefixes. To give
every row exactly the result llama-server gives it, the step reproduces, for each
row, the kernel llama-server would use:

- solo ubatches: the ubatch (first position, rows) llama-server computes the row
  in (`solo_ubatches`), including its cuts at images, context checkpoints and
  user turns of sliding-window and hybrid models (`turn_starts`);
- matmul row plans (`RowPlan`): rows that take the many-row kernel of repacked
  (gemm) or k-quant (tiled) weights are gathered into such calls;
- flash-attention calls (`attention_calls`): tiled, split or row-by-row, over the
  cells llama.cpp would use.

Expert products (ggml_mul_mat_id, MoE layers) need no plan where llama.cpp's
result for a row does not depend on its batch: stacks of experts that the CPU
backend repacks (Q4_0, Q4_K, IQ4_NL, MXFP4 on AVX2) run one gemv per (row,
expert), the other types one vec_dot per row. Not reproduced: k-quant stacks
that are not repacked (Q2_K, Q3_K, Q5_K, Q6_K on AVX2) take a tiled kernel for
an expert that >= 8 rows of the call chose, which depends on how the other rows
of llama.cpp's ubatch were routed.

Everything here is off with `KernelParity(enabled=False)` (GPU builds, where no
llama.cpp CPU reference applies, or speed comparisons): plain mul_mat calls and
one attention call per step. Nothing outside this module knows these rules.
"""
from __future__ import annotations

import numpy as np

from ggserve.native import ggml
from ggserve.server.engine.memory.kv_cache import N_KV_PAD

UBATCH = 512          # llama.cpp's default -ub: how it cuts a prompt into ubatches
CHECKPOINT_TAIL = 4   # llama-server's context checkpoints: the last 4 prompt tokens go alone

# ggml's CPU mul_mat picks a kernel per call from its row count:
# - weights repacked into interleaved layouts: rows in groups of four by gemm,
#   the last n % 4 rows one by one by gemv;
# - k-quant weights (not repacked): a tiled kernel for calls of >= 8 rows,
#   vec_dot below;
# - float weights (F32/F16/BF16): calls of >= 2 rows go to llamafile's tinyBLAS,
#   a lone row to vec_dot, which rounds differently ("sgemm": llamafile_sgemm
#   refuses n < 2; for its quantized types, Q8_0/Q4_0/Q5_0, both give the same bits);
# - other types: the same per-row result whatever the call.
TILED_TYPES = {"q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_xs", "iq2_xxs", "iq2_xs",
               "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"}
MATMUL_TILED_MIN_ROWS = 8
SGEMM_TYPES = {"f32", "f16", "bf16"}


# ggml's CPU flash attention: >= 64 query rows take a tiled kernel (f32), a lone
# row over >= 512 cells is split across threads, everything else runs row by row (f16)
FA_TILED_MIN_ROWS = 64
SPLIT_KV_MIN = 512


class KernelParity:
    """The per-step decisions above, or plain calls when disabled."""

    def __init__(self, enabled: bool, kernel_of: dict, checkpoints: bool):
        self.enabled = enabled
        self.kernel_of = kernel_of if enabled else {}     # weight -> "repack" | "tiled" | "sgemm"
        self.kinds = sorted(set(self.kernel_of.values()))
        # llama-server saves context checkpoints (and cuts batches for them) for models
        # whose memory cannot be cut back: sliding-window and recurrent layers
        self.checkpoints = checkpoints
        # the fewest rows an attention call has (padding), for the worst-case reservation
        self.min_attention_rows = FA_TILED_MIN_ROWS if enabled else 1

    def ubatches(self, chunks) -> tuple[np.ndarray, np.ndarray] | None:
        """Per row of the batch: (first position, rows) of its solo ubatch."""
        if not self.enabled:
            return None
        # (llama-server saves checkpoints, and cuts batches for them, for completions only: not embeddings)
        solo = [solo_ubatches(np.arange(c.start, c.start + c.n), c.seq.n_prompt, c.seq.images,
                              self.checkpoints and c.seq.pool is None, c.seq.request.turn_starts) for c in chunks]
        return np.concatenate([u[0] for u in solo]), np.concatenate([u[1] for u in solo])

    def attention_calls(self, seq_ids: np.ndarray, ubatches, view_for, cells=None) -> list[tuple[int, int, int, int, int]]:
        """view_for(seq, upto=None): the cells llama.cpp attends over for seq alone
        (when its last cell is `upto`); cells: each row's cell."""
        if not self.enabled:      # one call over every cell the batch's sequences use
            views = [view_for(s) for s in set(seq_ids.tolist())]
            n = len(seq_ids)
            return [(0, n, min(v[0] for v in views), max(v[1] for v in views), n)]
        return attention_calls(seq_ids, ubatches[1] >= FA_TILED_MIN_ROWS, view_for,
                               None if cells is None else np.where(ubatches[1] == 1, cells, -1))

    def n_threads(self, calls, preferred: int, full: int) -> int:
        """Threads for a step: ggml's split flash-attention kernel (one query row
        over >= SPLIT_KV_MIN cells) cuts the cells into one chunk per thread, so such
        a row gets llama.cpp's result only with llama.cpp's thread count (`full`)."""
        if self.enabled and any(rows == 1 and c1 - c0 >= SPLIT_KV_MIN for _, _, c0, c1, rows in calls):
            return full
        return preferred

    def row_plans(self, positions: np.ndarray, ubatches, n_outputs: int) -> list["RowPlan"]:
        return [RowPlan(kind, batched_rows(kind, positions, *ubatches), n_outputs) for kind in self.kinds]

    @property
    def cuts_at_user_turns(self) -> bool:
        """Whether llama-server ends a chat prompt's batches at user messages here
        (sliding-window and hybrid models, with parity on): the chat layer then hands
        each request its turn starts (`Request.turn_starts`) as data."""
        return self.enabled and self.checkpoints

def solo_ubatches(positions: np.ndarray, n_prompt: int, image_spans=(), checkpoints: bool = False,
                  turn_starts=()):
    """For rows of one sequence at `positions`: (first position, row count) of the
    ubatch llama-server computes each in when the sequence runs alone.

    llama-server decodes a prompt chunk by chunk (text runs, and each image's
    embeddings through mtmd), and llama_decode cuts each chunk into UBATCH-row
    ubatches from its start. For models with a sliding window or recurrent layers
    (`checkpoints`) it also ends a text batch CHECKPOINT_TAIL and CHECKPOINT_TAIL +
    UBATCH tokens before the prompt's end, and before the user messages of a chat
    where it saves context checkpoints (`turn_starts`: server/chat/turns.py). Generated tokens come one per ubatch.
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
    the tiled kernel when k >= 8 ("tiled"), tinyBLAS when k >= 2 ("sgemm")."""
    if kind == "repack":
        return positions - ub_start < ub_size // 4 * 4
    if kind == "sgemm":
        return ub_size >= 2
    return ub_size >= MATMUL_TILED_MIN_ROWS


class RowPlan:
    """How the rows of a batch meet one kind of weight so that each row gets the
    kernel llama.cpp gives it alone, whatever else shares the batch: rows that
    take the many-row kernel are gathered first (padded by repeating a row), the
    others follow in calls too small for it. A call is (first row, rows, one):
    `one` multiplies each row on its own (ggml's one-column kernel, vec_dot: a
    [k, 1, rows] operand), in one product."""

    def __init__(self, kind: str, batched: np.ndarray, n_outputs: int):
        self.kind = kind
        n_tokens = len(batched)
        self.n_tokens = n_tokens
        solo_max = self.solo_max = {"repack": 3, "sgemm": 1}.get(kind, MATMUL_TILED_MIN_ROWS - 1)
        many = np.flatnonzero(batched)
        few = np.flatnonzero(~batched)
        if len(many):
            pad = {"repack": -len(many) % 4, "sgemm": max(0, 2 - len(many))}.get(
                kind, max(0, MATMUL_TILED_MIN_ROWS - len(many)))
            many = np.concatenate([many, np.repeat(many[-1:], pad)])
            # gemm leaves the last n % 4 rows to gemv: up to three solo rows ride along
            first = len(many) + (min(solo_max, len(few)) if kind == "repack" else 0)
            self.calls = [(0, first, False)] + _solo_calls(first, len(many) + len(few), solo_max)
            self.perm = np.concatenate([many, few]).astype(np.int32)
            if len(self.perm) == n_tokens and not np.any(self.perm - np.arange(n_tokens)):
                # rows already in kernel order, no padding (a whole 512-row ubatch):
                # the calls cut the batch as it is, with no gather before or after
                self.perm = self.inv = None
            else:
                inv = np.empty(n_tokens, dtype=np.int32)
                inv[self.perm[::-1]] = np.arange(len(self.perm), dtype=np.int32)[::-1]   # first copy wins
                self.inv = inv
        else:
            self.calls = _solo_calls(0, n_tokens, solo_max)
            self.perm = self.inv = None
        # after the last layer keeps only the output rows, every row is a solo row
        self.out_calls = _solo_calls(0, n_outputs, solo_max)
        self.t_perm = self.t_inv = self._g = None

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
        """Start a graph: the permutation inputs are declared by the first product
        that uses them (a model whose only such weight is its output matrix, applied
        to the output rows alone, never does)."""
        self.t_perm = self.t_inv = None
        self._g = g

    def _inputs(self):
        if self.t_perm is None:
            self.t_perm = self._g.input(f"mm_perm_{self.kind}", ggml.I32, (len(self.perm),))
            self.t_inv = self._g.input(f"mm_inv_{self.kind}", ggml.I32, (self.n_tokens,))
        return self.t_perm, self.t_inv

    def apply(self, g, w, x, full_batch: bool):
        # after the last layer: the output rows, or fewer (the LM head skips the rows that
        # want only their hidden state), each a solo row
        calls = self.calls if full_batch else _solo_calls(0, x.ne[1], self.solo_max)
        permuted = full_batch and self.perm is not None
        if len(calls) == 1 and not permuted and not calls[0][2]:
            return g.mul_mat(w, x)
        if permuted:
            t_perm, t_inv = self._inputs()
            x = g.get_rows(x, t_perm)
        outs = [_product(g, w, x, r0, n, one) for r0, n, one in calls]
        while len(outs) > 1:
            outs = [g.concat(outs[i], outs[i + 1], 1) if i + 1 < len(outs) else outs[i]
                    for i in range(0, len(outs), 2)]
        out = outs[0]
        if permuted:
            out = g.get_rows(out, t_inv)
        return out


def _product(g, w, x, r0: int, n: int, one: bool):
    """w times rows r0 .. r0 + n of x; `one`: each row in a one-column product."""
    if not one:
        return g.mul_mat(w, g.view(x, (x.ne[0], n), (x.nb[1],), r0 * x.nb[1]))
    out = g.mul_mat(w, g.view(x, (x.ne[0], 1, n), (x.nb[1], x.nb[1]), r0 * x.nb[1]))
    return g.reshape(out, out.ne[0], n)


def _solo_calls(start: int, end: int, size: int) -> list[tuple[int, int, bool]]:
    """Rows start .. end in calls of at most `size` rows (1: one product of one-column calls)."""
    if size == 1:
        return [(start, end - start, True)] if end > start else []
    return [(a, n, False) for a, n in _chunks(start, end, size)]


def _chunks(start: int, end: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(size, end - a)) for a in range(start, end, size)]


def attention_calls(seq_ids: np.ndarray, tiled: np.ndarray, view_for,
                    solo_cells=None) -> list[tuple[int, int, int, int, int]]:
    """(first row, end row, first cell, end cell, rows incl. padding) per flash-attention call.

    Why: every row must be computed by the kernel llama.cpp uses for it when
    its sequence runs alone and fresh, whatever else is in the batch, however
    the prompt was chunked and whatever prefix was reused:
    - prompt rows of a >= 64-row ubatch (`tiled`): the tiled kernel. Their
      sequence gets a call of its own, padded with dummy rows to 64 when fewer
      remain (a prompt chunked finely, the tail after a reused prefix). The
      tiled kernel's result for a row does not depend on the other rows.
    - a lone row over >= 512 cells: the thread-split kernel, whose result
      depends on where the cells lie in the call; it gets a call of its own
      over exactly the cells llama.cpp would use (`view_for(seq)`).
    - the rest: the row-by-row kernel, which skips masked cells, so rows of
      several sequences share a call (< 64 rows, over the union of their cell
      ranges, when the ranges lie close together) and each still gets exactly
      its solo result.
    - rows that are ubatches of their own (generated tokens: `solo_cells` gives
      their cell, -1 for the others; several of one sequence when drafted tokens
      are verified): each a run of its own, over the cells llama.cpp's step for it
      would see, up to its own cell.
    """
    runs, t0 = [], 0
    ids, tl = seq_ids.tolist(), tiled.tolist()
    solo = [-1] * len(ids) if solo_cells is None else solo_cells.tolist()
    for t1 in range(1, len(ids) + 1):
        if t1 == len(ids) or ids[t1] != ids[t0] or tl[t1] != tl[t0] or max(solo[t0], solo[t1]) >= 0:
            view = view_for(ids[t0], solo[t0]) if solo[t0] >= 0 else view_for(ids[t0])
            runs.append((t0, t1) + view + (bool(tl[t0]),))
            t0 = t1
    calls, group = [], []

    def flush():
        if group:
            calls.append((group[0][0], group[-1][1], min(r[2] for r in group),
                          max(r[3] for r in group), group[-1][1] - group[0][0]))
            group.clear()

    for t0, t1, c0, c1, is_tiled in runs:
        rows = t1 - t0
        if is_tiled:
            flush()
            calls.append((t0, t1, c0, c1, max(rows, FA_TILED_MIN_ROWS)))
        elif rows == 1 and c1 - c0 >= SPLIT_KV_MIN:
            flush()
            calls.append((t0, t1, c0, c1, 1))
        else:
            for a in range(t0, t1, FA_TILED_MIN_ROWS - 1):      # never >= 64 rows in one call
                b = min(t1, a + FA_TILED_MIN_ROWS - 1)
                if group and (group[-1][1] - group[0][0] + (b - a) >= FA_TILED_MIN_ROWS
                              or _union_waste(group, c0, c1) > N_KV_PAD):
                    flush()
                group.append((a, b, c0, c1))
    flush()
    return calls


def _union_waste(group, c0: int, c1: int) -> int:
    """Cells a shared call would walk that belong to none of its sequences' ranges:
    sequences in distant regions of the cache are cheaper attended apart (the kernel
    still visits every masked cell)."""
    ranges = sorted([(g[2], g[3]) for g in group] + [(c0, c1)])
    covered, end = 0, ranges[0][0]
    for a, b in ranges:
        if b > end:
            covered += b - max(a, end)
            end = b
    return end - ranges[0][0] - covered
