"""Embeddings: ggserve against llama-server, same model and settings, one run.

    python bench/embeddings.py [--model M.gguf] [--llama-server PATH] [--pooling mean]
                               [--requests 32] [--tokens 128] [--concurrency 4] [--rounds 2]
                               [--out embeddings.json]

Starts both servers with --embeddings (ggserve `-np P -c C -b B -t T`, llama-server the
same with `-ub B`), then, round after round in alternating order (A B, B A ...):

- throughput: `--requests` POST /v1/embeddings of one distinct input of about
  `--tokens` tokens each, `--concurrency` at a time: embeddings/s and prompt tokens/s;
- beside chats: `--parallel` - 2 streaming chats (greedy, ignore_eos, `--chat-tokens`
  each) alone, then again while embedding requests run two at a time in the other
  two slots: the chats' inter-token gaps (p50, max) and how many embeddings
  finished meanwhile.

(llama-server 11434 aborts at start-up with --embeddings and -np 6: GGML_ASSERT
ggml_can_mul_mat in common_fit_params; -np 4, the default here, starts.)

ggserve batches embedding rows into the chats' steps; llama-server never puts an
embedding task and a completion in one batch (server_slot::can_batch_with), so it
alternates them. Prints a table and writes JSON (bench/common.py's envelope).
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import asyncio
import importlib.util
import json
import random
import tempfile
import time

import httpx


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(_HERE, file))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


common = _load("ggserve_bench_common", "common.py")
serve = _load("ggserve_bench_serve", "serve.py")      # Server, ports, argv builders

WORDS = ("engine scheduler batch token model cache vector query passage search index layer norm "
         "embedding server request stream latency memory slot prompt answer").split()


def text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


async def throughput(url: str, inputs: list[str], concurrency: int) -> dict:
    queue = list(inputs)
    tokens = 0

    async def worker(client):
        nonlocal tokens
        while queue:
            x = queue.pop()
            r = await client.post(url + "/v1/embeddings", json={"input": x})
            r.raise_for_status()
            tokens += r.json()["usage"]["prompt_tokens"]

    t = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    wall = time.perf_counter() - t
    return {"wall_s": wall, "embeddings_per_s": len(inputs) / wall, "prompt_tps": tokens / wall}


async def chat(client, url: str, i: int, max_tokens: int) -> list[float]:
    body = {"messages": [{"role": "user", "content": f"Tell story number {i}."}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    times = []
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"] and \
                    json.loads(line[6:])["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
    return [b - a for a, b in zip(times, times[1:])]


async def beside_chats(url: str, inputs: list[str], n_chats: int, max_tokens: int, with_embeddings: bool) -> dict:
    done = 0
    async with httpx.AsyncClient(timeout=600) as client:
        chats = asyncio.gather(*(chat(client, url, i, max_tokens) for i in range(n_chats)))

        async def embed_loop(k):
            nonlocal done
            while not chats.done():
                r = await client.post(url + "/v1/embeddings", json={"input": inputs[(done + k) % len(inputs)]})
                r.raise_for_status()
                done += 1

        loops = [asyncio.ensure_future(embed_loop(k)) for k in range(2)] if with_embeddings else []
        gaps = [g for gs in await chats for g in gs]
        for f in loops:
            await f
    return {"itl_p50_ms": 1000 * common.percentile(gaps, 50), "itl_max_ms": 1000 * max(gaps),
            "embeddings_done": done}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--ggserve", default=None)
    ap.add_argument("--pooling", default="mean")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128, help="about this many tokens per input")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--chat-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=4 * 1024)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--load-timeout", type=float, default=300)
    ap.add_argument("--ggserve-args", default="", help="extra ggserve flags, e.g. '--max-stall-ms 200'")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.model is None:
        from ggserve.server.cli.main import default_model
        args.model = default_model()
    args.server_defaults = False
    args.ggserve_args = f"--embeddings --pooling {args.pooling} {args.ggserve_args}"
    args.llama_args = f"--embeddings --pooling {args.pooling}"
    args.mmproj = None

    rng = random.Random(0)
    inputs = [text(rng, int(args.tokens * 0.8)) for _ in range(args.requests)]
    logdir = tempfile.mkdtemp(prefix="bench-embeddings-")
    servers = []
    records = []
    try:
        serve.start_servers(args, logdir, servers)
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for s in order:
                rec = {"server": s.name, "round": rnd}
                rec.update(asyncio.run(throughput(s.url, inputs, args.concurrency)))
                for flag in (False, True):
                    r = asyncio.run(beside_chats(s.url, inputs, args.parallel - 2, args.chat_tokens, flag))
                    tag = "with_embeddings" if flag else "chats_alone"
                    rec.update({f"{tag}_{k}": v for k, v in r.items()})
                records.append(rec)
                print(json.dumps(rec), flush=True)
    finally:
        for s in servers:
            s.stop()
    summary = {}
    for name in {r["server"] for r in records}:
        rs = [r for r in records if r["server"] == name]
        summary[name] = {k: sum(r[k] for r in rs) / len(rs) for k in rs[0] if k not in ("server", "round")}
    print(f"{'server':14} {'emb/s':>7} {'tok/s':>7} {'ITL p50 alone':>14} {'ITL p50 +emb':>13} "
          f"{'ITL max +emb':>13} {'emb during chats':>17}")
    for name, m in summary.items():
        print(f"{name:14} {m['embeddings_per_s']:7.2f} {m['prompt_tps']:7.0f} {m['chats_alone_itl_p50_ms']:14.1f} "
              f"{m['with_embeddings_itl_p50_ms']:13.1f} {m['with_embeddings_itl_max_ms']:13.1f} "
              f"{m['with_embeddings_embeddings_done']:17.1f}")
    if args.out:
        common.write_json(args.out, common.envelope("embeddings", vars(args), records, summary=summary))


if __name__ == "__main__":
    main()
