"""Sampling cost per row: greedy and the default chain, at SmolLM2's and Gemma 3's vocab sizes.

Prints µs per row and writes bench/results/sampling.json.
    python bench/sampling.py [--steps N]
"""
import argparse
import json
import os
import platform
import time

import numpy as np

from ggserve.server.engine.sampling.sampler import SamplingParams, SequenceSampler, sample_batch

CASES = {
    "greedy": dict(temperature=0.0),
    "default": dict(),                                   # top_k 40, top_p .95, min_p .05, T .8
    "default+penalties": dict(repeat_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5, n_probs=5),
    "no_top_k": dict(top_k=0),                           # top_p over the whole vocab
}


def bench(n_vocab: int, n_rows: int, params: dict, steps: int) -> float:
    rng = np.random.default_rng(0)
    # logits shaped like a model's: a few strong tokens over a wide tail
    logits = (rng.standard_normal((n_rows, n_vocab)) * 2.5).astype(np.float32)
    samplers = [SequenceSampler(SamplingParams(seed=i, **params), prompt_tokens=range(64)) for i in range(n_rows)]
    sample_batch(logits, samplers)                                       # warm-up
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(steps):
            for s, r in zip(samplers, sample_batch(logits, samplers)):
                s.accept(r.token)
        best = min(best, (time.perf_counter() - t0) / steps / n_rows * 1e6)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    rows = []
    for n_vocab in (49152, 262144):
        for n_rows in (1, 16):
            for name, params in CASES.items():
                us = bench(n_vocab, n_rows, params, args.steps)
                rows.append(dict(case=name, n_vocab=n_vocab, n_rows=n_rows, us_per_row=round(us, 1)))
                print(f"{name:18s} vocab {n_vocab:6d} rows {n_rows:2d}: {us:8.1f} µs/row")
    out = dict(numpy=np.__version__, machine=platform.processor() or platform.machine(),
               cpus=os.cpu_count(), results=rows)
    path = os.path.join(os.path.dirname(__file__), "results", "sampling.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print("wrote", path)


if __name__ == "__main__":
    main()
