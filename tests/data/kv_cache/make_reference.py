"""Record llama-server's answers for tests/test_kv_context.py (see README.md here).

usage: python make_reference.py LLAMA_SERVER MODEL
Starts llama-server 11434 three times (a q8_0 and a q4_0 KV cache; context shift) and
writes q8_0.json, q4_0.json and context_shift.json next to this file.
"""
import json
import pathlib
import subprocess
import sys
import time

import httpx

HERE = pathlib.Path(__file__).parent
CASES = json.loads((HERE.parent / "completions.json").read_text())["models"]["smollm2"]
SHIFT_TEXT = ("The history of the city of Paris begins with a small settlement on an island in the "
              "river. Over the centuries, it grew into")


def serve(binary, model, args, port=18432):
    proc = subprocess.Popen([binary, "-m", model, "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("llama-server did not start")


def quantized(binary, model, kv_type="q8_0"):
    args = ["-c", "4096", "-np", "1", "-t", "2", "-ctk", kv_type, "-ctv", kv_type]
    proc, url = serve(binary, model, args)
    try:
        out = []
        for c in CASES:
            r = httpx.post(url + "/completion", json={
                "prompt": c["prompt_ids"], "n_predict": 48, "temperature": 0, "n_probs": 2,
                "cache_prompt": False, "return_tokens": True}, timeout=600).json()
            steps = [[[p["id"], p["logprob"]] for p in s["top_logprobs"]] for s in r["completion_probabilities"]]
            out.append({"key": c["key"], "prompt_ids": c["prompt_ids"], "generated_ids": r["tokens"],
                        "top2": steps})
        return {"llama_server_args": args, "cases": out}
    finally:
        proc.kill()


def context_shift(binary, model):
    args = ["-c", "256", "-np", "1", "-t", "1", "--context-shift"]
    proc, url = serve(binary, model, args)
    try:
        toks = httpx.post(url + "/tokenize", json={"content": SHIFT_TEXT, "add_special": False}).json()["tokens"]
        r = httpx.post(url + "/completion", json={
            "prompt": toks, "n_predict": 400, "temperature": 0, "ignore_eos": True,
            "return_tokens": True, "cache_prompt": False}, timeout=600).json()
        return {"llama_server_args": args, "prompt_text": SHIFT_TEXT, "prompt_ids": toks, "n_predict": 400,
                "generated_ids": r["tokens"], "content": r["content"], "truncated": r["truncated"]}
    finally:
        proc.kill()


def context_shift_keep(binary, model):
    """--keep 8: a request without n_keep keeps 8 prompt tokens through each shift, one with
    n_keep 100 keeps 100 (of the prompt and what followed it)."""
    args = ["-c", "256", "-np", "1", "-t", "1", "--context-shift", "--keep", "8"]
    proc, url = serve(binary, model, args)
    try:
        toks = httpx.post(url + "/tokenize", json={"content": SHIFT_TEXT, "add_special": False}).json()["tokens"]
        out = {"llama_server_args": args, "prompt_ids": toks, "n_predict": 300, "cases": {}}
        for name, extra in (("flag", {}), ("request_n_keep_100", {"n_keep": 100})):
            r = httpx.post(url + "/completion", json={
                "prompt": toks, "n_predict": 300, "temperature": 0, "ignore_eos": True,
                "return_tokens": True, "cache_prompt": False, **extra}, timeout=600).json()
            out["cases"][name] = {"request": extra, "generated_ids": r["tokens"],
                                  "n_keep": r["generation_settings"]["n_keep"]}
        return out
    finally:
        proc.kill()


if __name__ == "__main__":
    if sys.argv[3:] == ["keep"]:       # only context_shift_keep.json
        binary, model = sys.argv[1], sys.argv[2]
        (HERE / "context_shift_keep.json").write_text(json.dumps(context_shift_keep(binary, model)))
        sys.exit()
    binary, model = sys.argv[1], sys.argv[2]
    for kv_type in ("q8_0", "q4_0"):
        (HERE / f"{kv_type}.json").write_text(json.dumps(quantized(binary, model, kv_type)))
    (HERE / "context_shift.json").write_text(json.dumps(context_shift(binary, model)))
