"""Record llama-server's /rerank answers (the reference for tests/test_rerank.py).

    python tests/data/rerank/make_reference.py --llama-server PATH/TO/llama-server

For each model (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M) it starts

    llama-server -m MODEL --reranking -c 4096 -np 1 -t 2 --port PORT

and posts each case of `cases()` to /rerank: Jina's shape (`documents`) and TEI's
(`texts`, `return_text`), top_n, and the requests llama-server refuses. Writes
reference.json beside this file: per model and case, the request, the status and the
answer as llama-server gave it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "embeddings"))
from make_reference import LlamaServer, model_paths  # noqa: E402  (the embeddings reference's helpers)

DOCS = [
    "A machine is a physical system that uses power to apply forces and control movement to perform an action.",
    "Learning is the process of acquiring new understanding, knowledge, behaviors, skills, values and preferences.",
    "Machine learning is a field of study in artificial intelligence concerned with statistical algorithms "
    "that learn from data and generalize to unseen data.",
    "Paris, capitale de la France, est une grande ville européenne et un centre mondial de l'art.",
    "def train(model, data):\n    for x, y in data:\n        model.update(x, y)",
    "🙂 Emoji, naïve café and 日本語 in one document.",
]


def cases() -> list[tuple[str, dict]]:
    return [
        ("jina", {"query": "Machine learning is", "documents": DOCS}),
        ("jina_top_n", {"query": "What is the capital of France?", "documents": DOCS, "top_n": 2}),
        ("tei_return_text", {"query": "How do I train a model in Python?", "texts": DOCS[:4],
                             "return_text": True}),
        ("one_document", {"query": "Which city?", "documents": ["Paris, capitale de la"]}),
        ("error_no_query", {"documents": DOCS}),
        ("error_query_not_string", {"query": 5, "documents": DOCS}),
        ("error_empty_documents", {"query": "q", "documents": []}),
        ("error_documents_not_strings", {"query": "q", "documents": [1, 2, 3]}),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    a = ap.parse_args()
    ref = {"build": 11434, "models": {}}
    for name, path in model_paths().items():
        srv = LlamaServer(a.llama_server, path, ["--reranking"])
        srv.cmd.remove("--embeddings")         # --reranking sets it
        with srv:
            out = {"file": os.path.basename(path), "command": srv.command(), "cases": {}}
            for case, body in cases():
                r = srv.post("/rerank", body)
                out["cases"][case] = {"request": body, "status": r.status_code, "answer": r.json()}
        ref["models"][name] = out
    with LlamaServer(a.llama_server, model_paths()["smollm2"], []) as srv:      # --embeddings alone
        r = srv.post("/rerank", cases()[0][1])
        ref["not_enabled"] = {"command": srv.command(), "status": r.status_code, "answer": r.json()}
    with open(os.path.join(HERE, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
