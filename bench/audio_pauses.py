"""How long text streams pause while media prompts are built and join them (issue 34).

    python bench/audio_pauses.py [--family gemma4|ultravox|voxtral|qwen2a] [--order audio,image,image,audio]
                                 [--out bench/results/audio_pauses.json]

One engine on a synth-audio golden mmproj (../shared/golden/synth-audio), as the server runs
it: 4 text streams decode on one thread (the engine's), while another thread (the prompt
thread's part) decodes 4 golden clips, or loads 4 golden images, builds their prompts and
queues them; they join between steps. Per run: how long the prompts took to build, and the
text streams' gaps between tokens (p50, p99, longest) from when the media start arriving.
Runs go in the order given (A B B A) so that a change in the machine's load falls on both.
Images need an mmproj with a vision encoder (gemma4).
"""
from __future__ import annotations

import os
import sys

# bench/ holds scripts named like stdlib modules (tokenize.py): keep it off the import path
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import hashlib
import importlib.util
import pathlib
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))    # the golden data's helpers


def _load_common():
    spec = importlib.util.spec_from_file_location("ggserve_bench_common", HERE / "common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


common = _load_common()

import synth_audio as SA
from PIL import Image

from ggserve.models.audio.decode import Clip, decode
from ggserve.server.chat.prompts import PromptBuilder
from ggserve.server.engine.engine import Request
from ggserve.server.engine.sampling.sampler import SamplingParams

CLIPS = ["speech_espeak_22k_mono.wav", "dtmf_noise_48k_stereo_6s.wav", "chirp_44k1_stereo_3s.wav",
         "steps_16k_mono_30s.wav"]
IMAGES = ["checker_300x200.png", "grad_64x64.png", "gray_37x53.png", "tall_200x600.png"]
GREEDY = SamplingParams(temperature=0.0, top_k=1)


def media_prompt(builder, template, kind: str, name: str, salt: str):
    """A prompt as the server builds it; the salt makes its content key new (no cached embedding)."""
    if kind == "audio":
        data = SA.clip_bytes(name)
        media = Clip(decode(data), 16000)
    else:
        data = (SA.GOLDEN / "images" / name).read_bytes()
        media = Image.open(SA.GOLDEN / "images" / name)
        media.load()
        media = media.convert("RGB")
    return builder.build(template, [(hashlib.sha256(data + salt.encode()).hexdigest(), media)])


def run(engine, builder, template, kind: str, salt: str) -> dict:
    engine.clear_cache()
    engine.images.clear()
    for i in range(4):
        engine.add(Request(f"t{i}", engine.tokenizer.encode(f"text stream {i} says", add_special=True), GREEDY,
                           max_tokens=1900, ignore_eos=True))
    warm = time.perf_counter() + 0.3      # the streams decode a while first: the step cost is fitted
    while time.perf_counter() < warm:
        engine.step()
    pending, lock, built = [], threading.Lock(), {}

    def build():
        t0 = time.perf_counter()
        for i, name in enumerate(CLIPS if kind == "audio" else IMAGES):
            p = media_prompt(builder, template, kind, name, salt)
            with lock:
                pending.append(Request(f"m{i}", p.tokens, GREEDY, max_tokens=4, ignore_eos=True, images=p.images))
        built["s"] = time.perf_counter() - t0
    gaps, last = [], time.perf_counter()
    prompts = threading.Thread(target=build)
    prompts.start()
    end = None
    while end is None or time.perf_counter() < end:
        with lock:
            for r in pending:
                engine.add(r)
            pending.clear()
        events = engine.step()
        now = time.perf_counter()
        if any(e.request_id.startswith("t") and e.token is not None for e in events):
            gaps.append(now - last)
            last = now
        if end is None and not prompts.is_alive() and not pending and \
                not any(s.id.startswith("m") for s in engine.scheduler.running):
            end = now + 0.5            # the media answered; the streams go on a little
    prompts.join()
    for s in list(engine.scheduler.running) + list(engine.scheduler.waiting):
        engine.cancel(s.id)
    gaps.sort()
    ms = 1000.0
    return {"kind": kind, "build_ms": built["s"] * ms, "n_gaps": len(gaps), "gap_p50_ms": gaps[len(gaps) // 2] * ms,
            "gap_p99_ms": gaps[int(len(gaps) * 0.99)] * ms, "gap_max_ms": gaps[-1] * ms,
            "load_avg_1m": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="gemma4", choices=SA.FAMILIES)
    ap.add_argument("--order", default="audio,image,image,audio")
    ap.add_argument("--threads", type=int, default=1,
                    help="engine threads (default 1: on a shared 2-core machine two threads' barriers stretch steps)")
    ap.add_argument("--out", default=str(HERE / "results" / "audio_pauses.json"))
    args = ap.parse_args()
    engine = SA.engine(args.family, n_parallel=8, n_batch=512, n_ctx=16384, n_threads=args.threads)
    builder = PromptBuilder.for_engine(engine)
    template = SA.case(args.family, "tone_16k_mono_1s.wav")["apply_template_prompt"]
    runs = []
    try:
        for i, kind in enumerate(args.order.split(",")):
            r = run(engine, builder, template, kind, f"{time.time()}-{i}")
            runs.append(r)
            print(f"{kind:5s} prompts built in {r['build_ms']:6.0f} ms; text gaps p50 {r['gap_p50_ms']:5.1f} "
                  f"p99 {r['gap_p99_ms']:6.1f} max {r['gap_max_ms']:6.1f} ms (load {r['load_avg_1m']:.1f})", flush=True)
    finally:
        engine.close()
    common.write_json(args.out, common.envelope("audio_pauses", vars(args), runs))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
