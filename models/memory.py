"""What a model asks of memory, layer by layer, and what its forward pass gets.

A model declares one spec per layer (`Model.memory_layers(device_of_layer)`):
- LayerKV: an attention layer keeps K and V rows per token (the KV cache);
- LayerRecurrent: a linear-attention / SSM layer keeps a fixed-size state per
  sequence (e.g. a gated delta net's conv and recurrent state), whatever the
  sequence's length.
A hybrid model mixes both. The server owns the storage (server/engine/memory/model_memory.py) and
hands the forward pass one step's view of each kind: `ForwardInputs.kv`
(attention over the cache) and `ForwardInputs.recurrent` (the batch's states).
Nothing here knows how cells or states are laid out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class LayerKV:
    """What one attention layer stores per token: K and V row widths, its device, and
    which cells a token sees besides causality: the last `sliding_window` positions
    (0: all), or only those of its own `chunk`-position chunk (llama4's chunked
    attention; 0: no chunks). With `v_in_k` nothing is stored for V: it is read as the
    first n_embd_v values of each K row (MLA's compressed cache, llama.cpp's K-only
    cache for absorbed MLA). With `kv_from` >= 0 the layer stores nothing and attends
    over the K/V of layer `kv_from` (llama.cpp's shared KV layers, Gemma 4 E2B/E4B:
    widths and mask kind as that layer's)."""

    n_embd_k: int
    n_embd_v: int
    device: object
    sliding_window: int = 0     # 0: global attention
    chunk: int = 0              # 0: not chunked
    v_in_k: bool = False
    kv_from: int = -1           # >= 0: reads that layer's K/V, stores none
    # a sliding-window layer kept, as llama.cpp's iSWA cache keeps it, in cells of its
    # own: a ring of window + ubatch cells per sequence, whose placement decides the
    # order flash attention visits the cells in (opt-in while other SWA models keep theirs)
    window_cache: bool = False

    @property
    def mask_kind(self) -> tuple[int, int]:
        return self.sliding_window, self.chunk


@dataclass(frozen=True)
class LayerRecurrent:
    """What one recurrent layer stores per sequence: one f32 row of each size
    (e.g. (conv state elements, recurrent state elements)), on its device."""

    sizes: tuple[int, ...]
    device: object


def global_attention_layers(model, device_of_layer) -> list[LayerKV]:
    """Every layer of `model` attends globally with n_head_kv heads of head_dim."""
    n = model.head_dim * model.n_head_kv
    return [LayerKV(n, n, device_of_layer(il)) for il in range(model.n_layer)]


class AttentionStep(Protocol):
    """One step's attention memory, as a model's forward pass uses it."""

    def attention(self, g, il: int, q, k, v, scale: float, softcap: float = 0.0, sinks=None):
        """Store this batch's k, v for layer il and attend q over the sequence's cells
        (sinks: f32 [n_head] attention-sink logits, or None). k, v None: a layer whose
        spec has `kv_from` attends over that layer's cells, storing nothing."""


def equal_blocks(seq_rows) -> list[tuple[int, int, int, int]]:
    """The batch's sequences as blocks a recurrent layer computes in one call:
    (first row, rows per sequence, first sequence, sequences) for each run of
    consecutive sequences with the same number of rows, e.g. all the decodes of a
    step. A block is a [n_seq_tokens, n_seqs] tensor, as llama.cpp's equal-split
    ubatches give them to its recurrent layers."""
    blocks = []
    for i, (row, n) in enumerate(seq_rows):
        if blocks and blocks[-1][1] == n:
            r0, _, s0, k = blocks[-1]
            blocks[-1] = (r0, n, s0, k + 1)
        else:
            blocks.append((row, n, i, 1))
    return blocks


class RecurrentStep(Protocol):
    """One step's recurrent states: one row per sequence in the batch, in the
    order of `ForwardInputs.seq_rows`."""

    def state(self, g, il: int, i: int):
        """State tensor i of layer il for the batch's sequences: f32 [size, n_seqs]."""

    def store(self, g, il: int, i: int, new) -> None:
        """Write the batch's new state i of layer il back (f32 [size, n_seqs])."""

    def rows(self, g, il: int, i: int):
        """State tensor i of layer il whole (f32 [size, n_rows]) and the rows of the
        batch's sequences in it (i32 [n_seqs]), for an op that reads them itself
        (ggml_ssm_scan, as llama.cpp's build_rs hands it the states and their ids)."""
