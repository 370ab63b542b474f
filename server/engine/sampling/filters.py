"""The candidate filters of llama.cpp's sampler chain over logit rows: top_k (over one row
or many at once), typical_p and top_p, as server/engine/sampling/sampler.py applies them.

Order and ties as llama.cpp: candidates sorted by (-logit, token id); sums in float64
where llama.cpp sums in double.
"""
from __future__ import annotations

import math

import numpy as np


def _top_exact(vals: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest vals, sorted by (-val, position)."""
    n = vals.shape[0]
    if n > k:
        kth = np.partition(vals, n - k)[n - k]
        above = np.flatnonzero(vals > kth)
        ties = np.flatnonzero(vals == kth)[:k - above.size]         # lowest positions win ties
        pos = np.concatenate([above, ties])
    else:
        pos = np.arange(n)
    return pos[np.lexsort((pos, -vals[pos]))]


def top_k_rows(x: np.ndarray, rows: list[int], k: int) -> list[np.ndarray]:
    """Top-k token ids of each chosen row of x, each sorted by (-logit, id).

    A threshold from a strided subsample (its k-th largest value) bounds the
    candidates: at least k tokens reach it, so the true top k all do. The
    thresholds are found for all rows in one partition; each row then
    argpartitions only its few thousand candidates instead of the vocabulary.
    """
    n_vocab = x.shape[1]
    stride = int(math.sqrt(n_vocab / k))
    if stride < 4:
        return [_top_exact(x[i], k) for i in rows]
    sub = x[:, ::stride][rows]                                      # [len(rows), n_sub]
    n_sub = sub.shape[1]
    thr = np.partition(sub, n_sub - k, axis=1)[:, n_sub - k]        # [len(rows)]
    out = []
    for i, t in zip(rows, thr):
        cand = np.flatnonzero(x[i] >= t)
        out.append(cand[_top_exact(x[i, cand], k)])
    return out


def sorted_ids(row: np.ndarray) -> np.ndarray:
    """All token ids sorted by (-logit, id): a full sort, only for typical_p without top_k."""
    return np.argsort(-row, kind="stable")


def softmax64(vals: np.ndarray) -> np.ndarray:
    z = np.exp(vals.astype(np.float64) - float(vals.max()))
    return z / z.sum()


def top_p_count(vals: np.ndarray, p: float) -> int:
    """How many of the sorted candidates top_p keeps: up to the first whose cumulative probability reaches p."""
    cdf = np.cumsum(softmax64(vals))
    return min(int(np.searchsorted(cdf, p, side="left")) + 1, len(vals))


def top_p_prefix(row: np.ndarray, p: float, within: np.ndarray | None = None) -> np.ndarray:
    """top_p over the whole vocabulary without a full sort; ids sorted by (-logit, id).

    Sort only the best m tokens; if their cumulative probability (normalised
    over the whole vocabulary) reaches p, the cut lies inside them. Else grow m.
    `within` (ascending ids of all tokens above some logit) bounds the result:
    if the cut lies beyond it, it is returned whole.
    """
    n_vocab = row.shape[0]
    vmax = row.max()
    z = float(np.exp(row - vmax).sum(dtype=np.float64))
    if within is not None:
        ids = within[np.lexsort((within, -row[within]))]
        cdf = np.cumsum(np.exp(row[ids] - vmax), dtype=np.float64) / z
        n = int(np.searchsorted(cdf, p, side="left")) + 1
        return ids[:n]
    m = 256
    while m < n_vocab:
        ids = _top_exact(row, m)
        cdf = np.cumsum(np.exp(row[ids] - vmax), dtype=np.float64) / z
        if cdf[-1] >= p:
            return ids[:int(np.searchsorted(cdf, p, side="left")) + 1]
        m *= 8
    ids = sorted_ids(row)
    return ids[:top_p_count(row[ids], p)]


def typical_keep(vals: np.ndarray, p: float) -> np.ndarray:
    """Positions (ascending) that locally typical sampling keeps among sorted candidates.

    ref: llama_sampler_typical_apply; candidates ordered by |-log p - entropy|,
    kept until the cumulative probability exceeds p (strictly, unlike top_p).
    """
    prob = softmax64(vals)
    pos = prob > 0
    logp = np.full_like(prob, -np.inf)
    logp[pos] = np.log(prob[pos])
    entropy = -float(np.sum(prob[pos] * logp[pos]))
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    cdf = np.cumsum(prob[order])
    n = min(int(np.searchsorted(cdf, p, side="right")) + 1, len(vals))
    return np.sort(order[:n])
