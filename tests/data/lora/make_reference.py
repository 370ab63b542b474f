"""Record llama-server's answers with LoRA adapters and control vectors (the reference for
tests/test_lora.py).

    python tests/data/lora/make_reference.py --llama-server PATH/TO/llama-server

Makes the synthetic adapters (make_adapters.py, into a temp dir; their sha256 go into
reference.json) and runs llama-server (build 11434) on SmolLM2-135M-Instruct Q4_1 and on
the golden's synthetic Qwen3 as SERVERS lists (`llama-server -m MODEL -c 2048 -np 1 -t 2`
plus the adapter flags), each case greedy on /completion, one after another (every
answer is a request served alone). Writes reference.json beside this file: per server the
command line (files by name) and per case the request and llama-server's answer (its tokens and
top-5 logprobs per step). Nothing is reused between requests (`--cache-ram 0`, `cache_prompt: false`):
llama-server 11434's host-RAM prompt cache does not key on the adapters, so a prompt computed under
one adapter set came back under another and changed the answer.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import sys
import tempfile

import httpx

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from llama_server_run import llama_server, smollm2_path  # noqa: E402
from make_adapters import make_all  # noqa: E402

QWEN3 = "/work/shared/golden/synth/models/synth-qwen3-q8_0.gguf"
PROMPTS = {"smollm2": ["The capital of France is",
                       "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"],
           "qwen3": ["Hello world", "def fib(n):"]}
N_PREDICT = 24
# the adapter sets every LoRA server answers with (`lora` of the request; None: the field left out)
SETS = {"default": None, "none": [{"id": 0, "scale": 0.0}], "a": [{"id": 0, "scale": 1.0}],
        "b": [{"id": 1, "scale": 1.0}], "mix": [{"id": 0, "scale": 0.5}, {"id": 1, "scale": 1.5}]}
POST_SCALES = [{"id": 1, "scale": 2.0}]
# name -> (model, flags); FILE names a file of make_adapters
SERVERS = {
    "smollm2_lora": ("smollm2", ["--lora", "FILE:smollm2-lora-a.gguf", "--lora-scaled", "FILE:smollm2-lora-b.gguf:0.5"]),
    "qwen3_lora": ("qwen3", ["--lora", "FILE:qwen3-lora-a.gguf", "--lora-scaled", "FILE:qwen3-lora-b.gguf:0.5"]),
    "smollm2_init_without_apply": ("smollm2", ["--lora", "FILE:smollm2-lora-a.gguf", "--lora-init-without-apply"]),
    "smollm2_cvec": ("smollm2", ["--control-vector-scaled", "FILE:smollm2-cvec.gguf:2.0",
                                 "--control-vector-layer-range", "3", "20"]),
    "qwen3_cvec": ("qwen3", ["--control-vector", "FILE:qwen3-cvec.gguf"]),
}


def completion(url: str, prompt: str, lora) -> dict:
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "return_tokens": True, "n_probs": 5,
            "cache_prompt": False}
    if lora is not None:
        body["lora"] = lora
    r = httpx.post(url + "/completion", json=body, timeout=600)
    r.raise_for_status()
    out = r.json()
    # per step: the top-5 (id, logprob), llama-server's own order
    top = [[[t["id"], t["logprob"]] for t in p["top_logprobs"]] for p in out["completion_probabilities"]]
    return {"request": body, "content": out["content"], "tokens": out["tokens"], "top_logprobs": top}


def record_server(binary: str, model: str, flags: list[str], files: str) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = smollm2_path() if model == "smollm2" else QWEN3
    real = [os.path.join(files, f[5:]) if f.startswith("FILE:") else f for f in flags]
    # --cache-ram 0 and cache_prompt false: llama-server 11434's host-RAM prompt cache does not key on the
    # adapters (a prompt computed under one set comes back under another), so nothing is reused here
    args = ["-c", "2048", "-np", "1", "-t", "2", "--cache-ram", "0", "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with llama_server([binary, "-m", path, *args, *real], url):
        out = {"command": ["llama-server", "-m", os.path.basename(path), *args[:8],
                           *[f[5:] if f.startswith("FILE:") else f for f in flags]],
               "adapters": httpx.get(url + "/lora-adapters").json(), "cases": {}}
        two = "--lora-scaled" in flags         # two adapters: every set, then the scales POSTed
        for name, lora in (SETS if two else {"default": None}).items():
            out["cases"][name] = [completion(url, p, lora) for p in PROMPTS[model]]
        if two:
            body = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": N_PREDICT,
                    "temperature": 0, "lora": SETS["mix"], "cache_prompt": False}
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
            out["chat_mix"] = {"request": body, "content": r.json()["choices"][0]["message"]["content"]}
            r = httpx.post(url + "/lora-adapters", json=POST_SCALES)
            out["post"] = {"request": POST_SCALES, "status": r.status_code, "response": r.json(),
                           "adapters_after": httpx.get(url + "/lora-adapters").json(),
                           "cases": [completion(url, p, None) for p in PROMPTS[model]]}
    for entry in out["adapters"] + out.get("post", {}).get("adapters_after", []):
        entry["path"] = os.path.basename(entry["path"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    binary = ap.parse_args().llama_server
    with tempfile.TemporaryDirectory() as files:
        digests = make_all(files)
        out = {"files": digests, "n_predict": N_PREDICT, "prompts": PROMPTS,
               "servers": {name: record_server(binary, model, flags, files)
                           for name, (model, flags) in SERVERS.items()}}
    with open(HERE / "reference.json", "w") as f:
        json.dump(out, f, indent=1, sort_keys=True, ensure_ascii=False)


if __name__ == "__main__":
    main()
