"""The forward graph of a batch: built, reused while the batch keeps its shape,
computed. Owns the kept graph and the compute-buffer reservation."""
from __future__ import annotations

import time

import numpy as np

from ggserve.models.inputs import ForwardInputs
from ggserve.native import ggml
from ggserve.server.engine import adapter_step
from ggserve.server.engine.batch import Batch
from ggserve.server.engine.kernel_parity import KernelParity
from ggserve.server.engine.memory.model_memory import Memory


class BuiltGraph:
    """A forward graph kept between steps: decode steps of the same shape (same
    batch rows, attention calls and matmul row plans) only refill its inputs, as
    llama.cpp reuses its graph, skipping the Python build and ggml's allocation."""

    def __init__(self, key, graph, inputs: dict, logits, hidden=None):
        self.key = key
        self.graph = graph
        self.inputs = inputs       # input name -> tensor
        self.logits = logits
        self.hidden = hidden       # the output rows' final hidden states (steps with embeddings)


class GraphRunner:
    def __init__(self, backend, model, memory: Memory, parity: KernelParity, n_pos: int, adapters=None):
        self.backend = backend
        self.model = model
        self.memory = memory
        self.parity = parity
        self.n_pos = n_pos
        self.adapters = adapters    # server/engine/adapters.py (LoRA, control vectors), or None
        self.full_threads = backend.n_threads
        self._graph: BuiltGraph | None = None
        self.graph_builds = 0
        self.last_compute_seconds = 0.0
        self.last_hidden: np.ndarray | None = None

    def reserve(self, n_batch: int, n_seqs: int, embeddings: bool = False) -> None:
        """Size compute buffers for the worst case: a full batch attending over the whole
        cache; with embeddings, also one whose every row is an output (hidden states)."""
        self._reserve(n_batch, n_seqs, False)
        if embeddings:
            self._reserve(n_batch, n_seqs, True)

    def _reserve(self, n_batch: int, n_seqs: int, all_rows: bool) -> None:
        kv = self.memory.kv
        g = self.backend.graph()
        try:
            tokens = g.input("tokens", ggml.I32, (n_batch,))
            pos = g.input("pos", ggml.I32, (n_batch * self.n_pos,))
            n_logits = min(n_batch, n_seqs)
            out_ids = None if all_rows else g.input("out_ids", ggml.I32, (n_logits,))
            worst = kv.worst_case_calls(n_batch, self.parity.min_attention_rows)
            ring = self.memory.swa
            st = self.memory.declare(g, n_batch, worst,
                                     ring.worst_case_calls(n_batch, self.parity.min_attention_rows) if ring else None)
            inp = ForwardInputs(tokens, pos, out_ids, st, n_batch)
            if all_rows:
                inp.logit_rows = g.input("logit_rows", ggml.I32, (n_logits,))
            self._add_adapters(g, inp, tuple(range(len(self.adapters.loras))) if self.adapters else (), n_batch)
            if self.memory.recurrent is not None:
                k = min(n_batch, n_seqs)      # k sequences: k - 1 decodes and one prompt chunk
                inp.recurrent = self.memory.recurrent.step(g, np.arange(k))
                inp.seq_rows = tuple((i, 1) for i in range(k - 1)) + ((k - 1, n_batch - k + 1),)
            g.output(self.model.forward(g, inp))
            if all_rows:
                g.output(inp.hidden)
            self.backend.reserve(g)
        finally:
            g.close()

    def run(self, batch: Batch, cells: np.ndarray, n_threads: int) -> np.ndarray:
        """float32 [len(batch.out_rows), n_vocab]: the logits of the batch's output rows,
        computed with n_threads CPU threads (unless kernel parity needs all of them).
        The final hidden states of its embedding rows (`batch.hidden_rows`) are left in
        `last_hidden`: float32 [len(batch.hidden_rows), n_embd], or None."""
        kv = self.memory.kv
        n = batch.n
        is_token = batch.tokens >= 0
        n_tok = int(is_token.sum())
        n_logits = len(batch.out_rows)
        # with embedding rows every row is an output, as in llama.cpp with embeddings on (the
        # last layer computes each row with its own ubatch's kernel, a subset would take the
        # solo one), and the LM head takes the logits rows alone
        n_logit_rows = max(1, n_logits) if len(batch.hidden_rows) else None
        n_out = n if n_logit_rows else n_logits
        all_out = n_out == n
        ubatches = self.parity.ubatches(batch.chunks)
        calls = self.parity.attention_calls(batch.seq_ids, ubatches, kv.view_for, cells)
        ring = self.memory.swa
        ring_calls = self.parity.attention_calls(batch.seq_ids, ubatches, ring.view_for, self.memory.ring_cells()) \
            if ring is not None else []
        threads = self.parity.n_threads(calls + ring_calls, n_threads, self.full_threads)
        if threads != self.backend.n_threads:
            self.backend.set_n_threads(threads)
        plans = self.parity.row_plans(batch.positions[0], ubatches, n if all_out else max(1, n_out)) \
            if self.parity.kinds else []
        values = {"pos": batch.positions.ravel(),
                  **kv.step_values(cells, batch.seq_ids, batch.positions[0], batch.span_ids, calls)}
        if ring is not None:
            values.update(ring.step_values(self.memory.ring_cells(), batch.seq_ids, batch.positions[0],
                                           batch.span_ids, ring_calls))
        if hasattr(self.model, "step_values"):      # a model's own per-row inputs (llama4's temperature)
            values.update(self.model.step_values(batch.positions))
        for plan in plans:
            values.update(plan.values())
        active, lora_values = adapter_step.step_values(self.adapters, batch.chunks, n)
        values.update(lora_values)
        if n_tok:
            values["tokens"] = batch.tokens[is_token].astype(np.int32)
        if not all_out:
            values["out_ids"] = batch.out_rows if n_out else np.zeros(1, np.int32)
        if n_logit_rows is not None:
            values["logit_rows"] = batch.out_rows if n_logits else np.zeros(1, np.int32)
        blocks = self._image_blocks(batch.images) if batch.images else None
        if blocks:
            for name, _, lo, hi in blocks:
                values[name] = np.arange(lo, hi, dtype=np.int32)
            if n_tok:
                values["row_order"] = self._row_order(is_token)
        seq_rows = batch.seq_rows()
        seqs = None
        if self.memory.recurrent is not None:
            seqs, _ = batch.per_sequence()        # state rows in batch order
            values.update(self.memory.recurrent.step_values(np.asarray(seqs, dtype=np.int64)))
        # the graph is a function of these; the values above are its inputs
        key = (n, n_tok, all_out or n_out, n_logit_rows, tuple(calls), tuple(ring_calls), tuple(p.key for p in plans),
               tuple(r[1] for r in seq_rows), active)
        built = self._graph
        if blocks or built is None or built.key != key or not self.backend.holds(built.graph):
            if built is not None:
                built.graph.close()
            built = self._graph = self._build(key, n, n_tok, None if all_out else max(1, n_out), n_logit_rows,
                                              (calls, ring_calls), plans, blocks, seqs, seq_rows)
            self.graph_builds += 1
        try:
            t = time.perf_counter()
            # (a plan's inputs are absent from graphs that never use them)
            self.backend.compute(built.graph, {built.inputs[name]: arr for name, arr in values.items()
                                               if name in built.inputs})
            self.last_compute_seconds = time.perf_counter() - t
            out = built.logits.read()
            self.last_hidden = None
            if built.hidden is not None:
                self.last_hidden = built.hidden.read().reshape(n, -1)[batch.hidden_rows]
        finally:
            if blocks:       # image steps are one of a kind: not kept
                built.graph.close()
                self._graph = None
        return out.reshape(-1, self.model.n_vocab)[:n_logits]

    def _add_adapters(self, g, inp, active: tuple, n: int) -> None:
        """The LoRA adapters the rows use (`active`) and the control vectors, on inp."""
        if self.adapters is None:
            return
        inp.control = self.adapters.control or None
        if active:
            inp.adapters = adapter_step.AdapterGraph(g, self.adapters, active, n)

    def close(self) -> None:
        if self._graph is not None:
            self._graph.graph.close()
            self._graph = None

    @staticmethod
    def _row_order(is_token) -> np.ndarray:
        """Where each batch row comes from in concat(token rows, image rows)."""
        image_row_index = np.cumsum(~is_token) - 1
        order = np.where(is_token, np.cumsum(is_token) - 1, int(is_token.sum()) + image_row_index)
        return order.astype(np.int32)

    @staticmethod
    def _image_blocks(images):
        """The batch's image blocks (in batch order) with the names of their row inputs."""
        return [(f"image_rows_{i}", emb, lo, hi) for i, (_, emb, lo, hi) in enumerate(images)]

    @staticmethod
    def _image_embeddings(g, blocks):
        """The batch's image rows in batch order, looked up in the stored embeddings
        (as weights are: a view of a tensor from another buffer trips ggml's
        allocator) and joined in the graph on the device that holds them."""
        rows = None
        for name, emb, lo, hi in blocks:
            block = g.get_rows(emb["embd"], g.input(name, ggml.I32, (hi - lo,)))
            rows = block if rows is None else g.concat(rows, block, 1)
        return rows

    def _build(self, key, n, n_tok, n_out, n_logit_rows, calls, plans, image_blocks, seqs, seq_rows) -> BuiltGraph:
        """The forward graph for a batch of this shape (n_out None: every row is an output;
        n_logit_rows: the LM head takes that many of the output rows, and the output rows'
        hidden states are an output too)."""
        g = self.backend.graph()
        try:
            t_tokens = g.input("tokens", ggml.I32, (n_tok,)) if n_tok else None
            t_pos = g.input("pos", ggml.I32, (n * self.n_pos,))
            t_out = g.input("out_ids", ggml.I32, (n_out,)) if n_out is not None else None
            inp = ForwardInputs(t_tokens, t_pos, t_out, self.memory.declare(g, n, *calls), n, seq_rows=seq_rows)
            if seqs is not None:
                inp.recurrent = self.memory.recurrent.step(g, seqs)
            if plans:
                inp.kernel_of = self.parity.kernel_of
                inp.n_outputs = n if n_out is None else n_out
                inp.plans = {p.kind: p for p in plans}
                for p in plans:
                    p.declare(g)
            if image_blocks:
                inp.images = self._image_embeddings(g, image_blocks)
                if n_tok:
                    inp.order = g.input("row_order", ggml.I32, (n,))
            if n_logit_rows is not None:
                inp.logit_rows = g.input("logit_rows", ggml.I32, (n_logit_rows,))
            self._add_adapters(g, inp, key[-1], n)
            logits = g.output(self.model.forward(g, inp))
            hidden = g.output(inp.hidden) if n_logit_rows is not None else None
        except BaseException:
            g.close()
            raise
        return BuiltGraph(key, g, {t.name: t for t in g.inputs}, logits, hidden)
