"""Embeddings from a prompt's final hidden states (the output norm's result, the
input of the LM head), as llama.cpp pools them.

Reranking (pooling rank, llama-server's --reranking) pools as `last` on these causal
models and scores with the pooled row's first element (rank_score).

ref: llama.cpp src/llama-graph.cpp build_pooling, llm_graph_input_mean/cls::set_input;
common/common.cpp common_embd_normalize. An embedding sequence is computed chunk by
chunk like any prompt (attention stays causal, as llama-server keeps it for
decoder-only models), so a `Pool` collects the rows it needs from each step.
"""
from __future__ import annotations

import numpy as np

KINDS = ("none", "mean", "cls", "last", "rank")
# llama.cpp's enum llama_pooling_type, as GGUF's `<arch>.pooling_type` stores it
_BY_GGUF = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def from_gguf(meta: dict) -> str:
    """The model's default pooling (llama.cpp: none when the GGUF does not say)."""
    arch = meta.get("general.architecture")
    return _BY_GGUF.get(meta.get(f"{arch}.pooling_type", -1), "none")


class Pool:
    """The hidden rows one embedding sequence needs, gathered over its steps."""

    def __init__(self, kind: str, n_prompt: int):
        if kind not in KINDS:
            raise ValueError(f"pooling {kind!r} is not supported")
        self.kind = kind
        self.n_prompt = n_prompt
        self._sum = None          # mean: float64 [n_embd]
        self._rows: list[np.ndarray] = []

    def rows(self, start: int, n: int) -> np.ndarray:
        """Offsets, within the chunk of prompt tokens [start, start + n), of the rows
        whose hidden state this pooling reads."""
        if self.kind in ("mean", "none"):
            return np.arange(n, dtype=np.int32)
        if self.kind == "cls":
            return np.zeros(1 if start == 0 else 0, dtype=np.int32)
        # last, and rank: a causal reranker reads its last token (llm_graph_input_cls)
        return np.full(1 if start + n == self.n_prompt else 0, n - 1, dtype=np.int32)

    def add(self, hidden: np.ndarray) -> None:
        """hidden: float32 [k, n_embd], the rows `rows()` named for one chunk."""
        if not len(hidden):
            return
        if self.kind == "mean":
            s = hidden.sum(axis=0, dtype=np.float64)
            self._sum = s if self._sum is None else self._sum + s
        else:
            self._rows.append(np.array(hidden, dtype=np.float32))

    def result(self) -> np.ndarray:
        """float32 [1, n_embd] pooled, or [n_prompt, n_embd] per token (none)."""
        if self.kind == "mean":
            return (self._sum / self.n_prompt).astype(np.float32)[None, :]
        return np.concatenate(self._rows)


def rank_score(pooled: np.ndarray) -> float:
    """A rerank score from a rank-pooled row: its first element, as llama-server's send_rerank
    reads it (the models ggserve runs have no classification head, so the row is the output
    norm's result at the last token)."""
    return float(pooled.reshape(-1)[0])


def normalize(v: np.ndarray, p: int) -> np.ndarray:
    """llama-server's `embd_normalize`: -1 none, 0 max absolute scaled to int16's
    range, 1 taxicab, 2 Euclidean, > 2 p-norm. Sums in float64 as llama.cpp does."""
    x = np.asarray(v, dtype=np.float32)
    if p == -1:
        s = 1.0
    elif p == 0:
        s = float(np.abs(x).max(initial=0.0)) / 32760.0
    elif p == 2:
        s = float(np.sqrt(np.sum(np.square(x, dtype=np.float32), dtype=np.float64)))
    else:
        s = float(np.sum(np.abs(x).astype(np.float64) ** p) ** (1.0 / p))
    return (x.astype(np.float64) * (1.0 / s if s > 0 else 0.0)).astype(np.float32)
