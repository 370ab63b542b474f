"""Who runs this step and how many tokens each: plain data, no tensors.

Like vLLM's v1 scheduler there are no prefill or decode phases: each sequence has
tokens computed and tokens pending, and a step hands out a token budget. Running
decodes go first (one token each) so streams never stall behind a long prompt;
prompt chunks fill what is left of the budget. When several prompts wait, the
step takes the shortest first, and only as many as make their times to first token
smallest in sum under the measured cost of a step (StepCost: a fixed part and a
part per row): where rows dominate (a CPU) prompts that arrive together are
computed one after the other, the first answered after its own prompt instead of
after all of them; where the fixed part dominates (a GPU) they share one step.
While streams are decoding, a step's prompt rows are sized by time (`prompt_cap`, from
the fitted StepCost) so that the step takes at most the stall budget: by default
(`max_stall_s` < 0) STALL_DECODE_STEPS times a step of decodes alone, at least STALL_FLOOR_S.
llama-server computes prompts that arrive together before any of them decodes, and
one that arrives mid-stream in one batch of up to n_batch rows (seconds on a CPU);
here a stream pauses at most about the budget per token, and prompts that arrive
together go one by one only where that is faster in sum even at the budget's pace.

`plan()` returns a StepPlan, frozen: the chunks (already stopped short of image
tiles that have no embedding yet), the tile the encoder may start (an encoder
budget of one tile in flight), or the tile the step must encode first because
no row can run without it, and the prompts held waiting for a shared prefix.
The engine executes a plan as it is; nothing changes it afterwards.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from ggserve.server.engine.sequence import Sequence

# smallest prompt chunk a capped step still takes (progress while streams decode);
# below 8 rows k-quant matmuls leave their tiled kernel (kernel_parity)
MIN_PROMPT_ROWS = 8
# the default stall budget: a step with decodes in it may take this many times what
# a step of decodes alone takes (a stream then decodes at half speed, not at zero),
# and at least STALL_FLOOR_S (a pause a reader does not notice; llama-server's longest
# gap between tokens of 4 streams of a 1B model on two cores is about this)
STALL_DECODE_STEPS = 2.0
STALL_FLOOR_S = 0.25


ROW_COST_MIN_ROWS = 64     # steps this big or bigger measure the compute cost of a row
MAX_SKIPS = 8              # a prompt passed over this many steps running goes first (no starvation)
# llama-server's default -b: prompts waiting together whose rows fit one of its batches
# get their first tokens together there; more rows, and the first answered decode
# while the rest is computed (here: in steps within the stall budget)
LLAMA_SERVER_BATCH = 2048


class StepCost:
    """A step's wall time as fixed + per_row * rows, fitted by least squares over the
    steps measured, the recent ones weighing most."""

    DECAY = 0.95

    def __init__(self, min_row_variance: float = 16.0):
        self._sums = [0.0] * 5        # weight, rows, seconds, rows², rows·seconds
        # below this spread of row counts the slope is not told apart from noise
        self.min_row_variance = min_row_variance
        self._last: tuple[float, float] | None = None

    def observe(self, rows: int, seconds: float) -> None:
        w, x, y, xx, xy = (v * self.DECAY for v in self._sums)
        self._sums = [w + 1, x + rows, y + seconds, xx + rows * rows, xy + rows * seconds]

    def fit(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per row), or None until steps of different sizes were seen;
        while the recent steps are too alike to tell the two parts apart, the last fit."""
        w, x, y, xx, xy = self._sums
        if w < 2:
            return self._last
        mx, my = x / w, y / w
        var = xx / w - mx * mx
        if var < self.min_row_variance:
            return self._last
        per_row = (xy / w - mx * my) / var
        if per_row > 0:
            self._last = (max(my - per_row * mx, 0.0), per_row)
        return self._last


@dataclass(frozen=True)
class Chunk:
    seq: Sequence
    start: int          # index into seq.tokens
    n: int
    wants_logits: bool  # the chunk reaches the end of the known tokens
    draft: tuple = ()   # drafted tokens after the pending one (the chunk's last len(draft) rows)


@dataclass(frozen=True)
class StepPlan:
    chunks: tuple[Chunk, ...]
    encode: object | None = None       # a tile (TileSpan) to start encoding beside this step
    encode_first: object | None = None  # no row can run before this tile is encoded
    held: frozenset = frozenset()      # prompts waiting for a prefix another sequence computes

    @property
    def n_rows(self) -> int:
        return sum(c.n for c in self.chunks)


class Scheduler:
    def __init__(self, n_slots: int, n_batch: int, max_stall_s: float = 0.0):
        self.n_slots = n_slots
        self.n_batch = n_batch
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # while streams decode, steps are sized to take about max_stall_s (0: no cap, as
        # llama-server; < 0: STALL_DECODE_STEPS decode steps), from the fitted step cost
        self.max_stall = max_stall_s
        self.cost = StepCost()
        self._decode_seconds = 0.0     # a step of decodes alone, recent ones weighing most
        self._prompt_row_seconds = 0.0  # what a prompt row adds to a step beside decodes (measured)
        self._decode_rows = 0          # decode rows in the last step planned
        # steps of decodes and their drafts alone: what a drafted row adds to such a step
        # (server/engine/speculative/speculator.py); prompt rows cost less each, they would hide it. One stream's
        # steps are 1 row, and its first draft is a 1-token probe: one 2-row step among some
        # twenty (DECAY's weight) is a spread of 0.05, which has to tell the slope
        self.decode_cost = StepCost(min_row_variance=0.02)
        self._prompt_rows = 0          # prompt rows in the last step planned
        self._skipped: dict[str, int] = {}     # prompt id -> steps it was passed over in a row

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq_id: str) -> Sequence | None:
        self._skipped.pop(seq_id, None)
        for s in self.running:
            if s.id == seq_id:
                self.running.remove(s)
                return s
        for s in self.waiting:
            if s.id == seq_id:
                self.waiting.remove(s)
                return s
        return None

    def admit(self) -> list[Sequence]:
        """Move waiting sequences to running while slots are free (FIFO)."""
        admitted = []
        while self.waiting and len(self.running) < self.n_slots:
            seq = self.waiting.popleft()
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def plan(self, held: frozenset, tile_ready: Callable[[str], bool], encoder_free: bool) -> StepPlan:
        """This step's plan (see the module docstring). tile_ready(key): is that
        tile's embedding stored; encoder_free: may a tile start encoding now."""
        chunks, missing = _stop_at_missing_tiles(self.schedule(None, held), tile_ready)
        if missing is None:
            return StepPlan(chunks, held=held)
        if chunks:
            return StepPlan(chunks, encode=missing if encoder_free else None, held=held)
        return StepPlan((), encode_first=missing, held=held)

    def stall_budget(self) -> float | None:
        """Seconds a step with decodes in it may take (None: no limit, or nothing
        measured yet for the default budget)."""
        if self.max_stall >= 0:
            return self.max_stall or None
        if not self._decode_seconds:
            return None
        return max(STALL_DECODE_STEPS * self._decode_seconds, STALL_FLOOR_S)

    def prompt_cap(self) -> int | None:
        """The most prompt rows of a step with decodes in it (None: no cap): as many as
        fit in the stall budget beside a step of decodes alone, at what a prompt row
        added to the last such steps (before any: the fitted cost of a row); before the
        first decode step, the smallest prompt chunk."""
        budget, fit = self.stall_budget(), self.cost.fit()
        if budget is None or not (self._prompt_row_seconds or fit):
            return None if not self.max_stall else 0
        per_row = self._prompt_row_seconds or fit[1]
        return max(0, int((budget - self._decode_seconds) / per_row))

    def predicted_seconds(self, n_rows: int) -> float | None:
        """A step of n_rows as the fitted cost predicts it (None: no fit yet)."""
        fit = self.cost.fit()
        return None if fit is None else fit[0] + fit[1] * n_rows

    def observe(self, n_rows: int, seconds: float, step_seconds: float) -> None:
        """A step of n_rows computed in `seconds` (step_seconds in all, what a stream
        waits): update the cost of a step, and of a decode step."""
        self.cost.observe(n_rows, step_seconds)
        if not self._prompt_rows:
            self.decode_cost.observe(n_rows, step_seconds)
            d = self._decode_seconds
            self._decode_seconds = step_seconds if not d else 0.8 * d + 0.2 * step_seconds
        elif self._decode_rows and self._decode_seconds:
            # steps beside decodes correct the cap fast (small chunks cost more a row than
            # a full step's, and a loaded machine changes what a row costs)
            per = max(step_seconds - self._decode_seconds, 0.0) / self._prompt_rows
            p = self._prompt_row_seconds
            self._prompt_row_seconds = per if not p else 0.5 * p + 0.5 * per

    def schedule(self, max_rows: int | None = None, hold: set = frozenset()) -> list[Chunk]:
        """This step's chunks. max_rows: the most rows a step with decodes in it
        should have (prompt chunks get at least MIN_PROMPT_ROWS of them; None: as the
        stall budget says); hold: ids of prompts that wait this step (another sequence
        is computing their prefix)."""
        budget = self.n_batch
        chunks = []
        # drafts ride only on steps no prompt waits for: their rows would delay its first token
        prompt_waits = any(s.prefilling and s.id not in hold for s in self.running)
        for s in self.running:
            if not s.prefilling and s.n_pending == 1 and budget > 0:
                draft = () if prompt_waits else s.draft[:budget - 1]   # a drafted token is one more row
                chunks.append(Chunk(s, s.n_computed, 1 + len(draft), True, draft))
                budget -= 1 + len(draft)
        if not chunks and (together := self._together(budget, hold)):
            self._decode_rows = 0
            self._prompt_rows = sum(c.n for c in together)
            return together
        full = budget
        decode_rows = self._decode_rows = sum(c.n for c in chunks)
        cap = max_rows - decode_rows if max_rows is not None else self.prompt_cap()
        if chunks and cap is not None:
            budget = min(budget, max(MIN_PROMPT_ROWS, cap))
        for s in self._prompts_first(budget, decode_rows, hold):
            if budget > 0:
                n = s.fit_chunk(s.n_computed, min(s.n_pending, budget))
                over_cap = False
                if n == 0 and budget < full:
                    # an image whose rows must share one batch goes whole, past the cap
                    span = s.span_at(s.n_computed)
                    if span is not None and span.end - s.n_computed <= full:
                        n, over_cap = span.end - s.n_computed, True
                if n == 0:
                    continue   # an image span that must share a batch waits for the next step
                chunks.append(Chunk(s, s.n_computed, n, s.n_computed + n == len(s.tokens)))
                budget = 0 if over_cap else budget - n
                full -= n
        self._prompt_rows = sum(c.n for c in chunks if c.seq.prefilling)
        return chunks

    def _together(self, budget: int, hold) -> list[Chunk]:
        """With no stream decoding, prompts that wait together get their first tokens in
        one step, as in llama-server's one batch (LLAMA_SERVER_BATCH rows at most in all):
        while they do not fit one step, each
        keeps its last row back (longest first), so none of them starts decoding (and
        stalls) while the others' rows are computed. Empty: no such plan (one prompt, or
        nothing could be held back)."""
        prompts = sorted((s for s in self.running if s.prefilling and s.id not in hold),
                         key=lambda s: -s.n_pending)
        if len(prompts) < 2 or sum(s.n_pending for s in prompts) > LLAMA_SERVER_BATCH:
            return []
        last_step = sum(s.n_pending for s in prompts) <= budget
        chunks = []
        for s in prompts:
            n = s.fit_chunk(s.n_computed, min(s.n_pending - (0 if last_step else 1), budget))
            if n > 0:
                chunks.append(Chunk(s, s.n_computed, n, s.n_computed + n == len(s.tokens)))
                budget -= n
        if last_step and len(chunks) < len(prompts):
            return []            # an image span kept a prompt from finishing: plan as usual
        return chunks

    def _prompts_first(self, budget: int, decode_rows: int, hold) -> list[Sequence]:
        """The prompts this step computes, in order (see the module docstring): for each m,
        the sum of the times to first token if this step takes the m shortest and each later
        step one more; the m with the smallest sum. Running order while there is no cost fit."""
        prompts = [s for s in self.running if s.prefilling and s.id not in hold]
        fit = self.cost.fit()
        if len(prompts) < 2 or fit is None:
            return prompts
        fixed, per_row = fit
        starved = [s for s in prompts if self._skipped.get(s.id, 0) >= MAX_SKIPS]
        rest = sorted((s for s in prompts if s not in starved), key=lambda s: s.n_pending)
        order = starved + rest
        sizes = [min(s.n_pending, budget) for s in order]
        best, best_m, rows = float("inf"), 1, 0
        for m in range(1, len(order) + 1):
            rows += sizes[m - 1]
            if m > 1 and rows > budget:
                break
            t = fixed + per_row * (decode_rows + rows)       # this step: the m first answered
            total, decodes = m * t, decode_rows + m
            for s in order[m:]:          # then one at a time, in steps beside the decodes
                cap = self.prompt_cap()
                cap = self.n_batch - decodes if cap is None else max(MIN_PROMPT_ROWS, cap)
                steps = -(-s.n_pending // max(1, cap))
                t += steps * (fixed + per_row * decodes) + per_row * s.n_pending
                total += t
                decodes += 1
            if total < best:
                best, best_m = total, m
        chosen = order[:best_m]
        for s in prompts:
            self._skipped[s.id] = 0 if s in chosen else self._skipped.get(s.id, 0) + 1
        return chosen

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)


def _stop_at_missing_tiles(chunks, tile_ready) -> tuple[tuple[Chunk, ...], object | None]:
    """The chunks stopped just before the first image tile each reaches that has
    no embedding yet, and the first such tile (None: all there)."""
    kept, missing = [], None
    for c in chunks:
        end = c.start + c.n
        for span in c.seq.images:
            if span.end <= c.start or span.start >= end or tile_ready(span.key):
                continue
            missing = missing or span
            end = max(span.start, c.start)
            break
        if end == c.start + c.n:
            kept.append(c)
        elif end > c.start:
            kept.append(Chunk(c.seq, c.start, end - c.start, end == len(c.seq.tokens)))
    return tuple(kept), missing
