"""Images through the engine: prompt layout and token counts as llama.cpp's mtmd,
greedy answers against llama.cpp's, encode-once store, chunking across batches.

Data: tests/data/multimodal.json (from shared/golden: llama-server chat completions
with one image_url part + "Describe this image.", greedy, 16 tokens). JPEG cases use
the pixels llama.cpp's stb_image decoded (tests/data/vision/*.stb.png), since Pillow's
JPEG decoder differs by up to 3 levels.
"""
import hashlib
import json
import os
import pathlib
import time

import numpy as np
import pytest
from PIL import Image

from ggserve.server.engine.engine import EngineConfig, Engine, Request
from ggserve.server.engine.sampling.sampler import SamplingParams
from engine_helpers import build_prompt, generate_requests, max_logprob_deviation, tokens, turn_starts

HERE = pathlib.Path(__file__).parent
GOLDEN = json.loads((HERE / "data" / "multimodal.json").read_text())["configs"]
IMAGES = HERE / "data" / "vision"
GREEDY = SamplingParams(temperature=0.0, top_k=1, n_probs=10)
CONFIGS = ["gemma3_f16", "gemma3_f32", "idefics3_f16", "idefics3_f32", "mlp_f16", "mlp_f32"]


def _image(name):
    """(sha256 of the file bytes, the pixels llama.cpp decoded)."""
    data = (IMAGES / name).read_bytes()
    img = Image.open(IMAGES / f"{name}.stb.png" if name.endswith(".jpg") else IMAGES / name)
    img.load()
    return hashlib.sha256(data).hexdigest(), img


def _image_or_same_size(case):
    """The golden image, or for the two large ones not copied here (noise, 2048x2048)
    a blank image of the same size: the layout depends only on the size."""
    if (IMAGES / case["image"]).exists():
        return _image(case["image"])
    return "0" * 64, Image.new("RGB", tuple(case["image_size"]))


@pytest.fixture(scope="module")
def engines(mmproj_dir, gemma3_path, smollm2_path, smolvlm_text_path):
    text = {"gemma3": gemma3_path, "idefics3": smolvlm_text_path, "mlp": smollm2_path}
    made = {}
    for name in CONFIGS:
        cfg = GOLDEN[name]
        made[name] = Engine(EngineConfig(text[cfg["projector"]], n_ctx=4096, n_batch=512, n_parallel=1, n_threads=2,
                            mmproj=str(mmproj_dir / cfg["mmproj"])))
    yield made
    for e in made.values():
        e.close()


def _case_list(configs):
    for name in configs:
        for r in GOLDEN[name]["results"]:
            if r["accepted"]:
                yield pytest.param(name, r, id=f"{name}-{r['image']}")


def _run(engine, prompt, spans, max_tokens, params=GREEDY):
    # a chat prompt, as llama-server's /v1/chat/completions gets it (engine_helpers.turn_starts)
    engine.add(Request("img", prompt, params, max_tokens=max_tokens, ignore_eos=True, images=spans,
                       turn_starts=turn_starts(engine, prompt, spans)))
    events = []
    while engine.has_work():
        events += engine.step()
    return events


@pytest.mark.parametrize("name,case", list(_case_list(CONFIGS)))
def test_prompt_tokens_equal_llama_cpp(engines, name, case):
    prompt, spans = build_prompt(engines[name], case["apply_template_prompt"], [_image_or_same_size(case)])
    assert len(prompt) == case["prompt_tokens"]


def test_idefics3_refuses_a_text_model_without_image_tokens(mmproj_dir, smollm2_path):
    # llama.cpp answers 400 "Invalid token" here (golden: idefics3_f16_unmodified_smollm2)
    e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_parallel=1, n_threads=2,
               mmproj=str(mmproj_dir / "mmproj-synth-idefics3-f16.gguf")))
    with pytest.raises(ValueError, match="<fake_token_around_image>"):
        build_prompt(e, "<__media__>Describe this image.", [_image("grad_64x64.png")])
    e.close()


def test_image_without_mmproj_is_refused(smollm2_path):
    e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_parallel=1, n_threads=2))
    with pytest.raises(ValueError, match="does not support images"):
        build_prompt(e, "<__media__>Describe this image.", [_image("grad_64x64.png")])
    e.close()


GREEDY_CASES = [
    pytest.param(name, r["image"], id=f"{name}-{r['image']}")
    for name in ("mlp_f16", "gemma3_f16", "idefics3_f16")
    for r in GOLDEN[name]["results"] if r["accepted"] and (IMAGES / r["image"]).exists()]


def _golden(name, image):
    return next(r for r in GOLDEN[name]["results"] if r["image"] == image)


def _answer(engines, name, image):
    """The golden case and our greedy events for it, from a fresh cache."""
    case = _golden(name, image)
    e = engines[name]
    e.clear_cache()
    prompt, spans = build_prompt(e, case["apply_template_prompt"], [_image(image)])
    return case, _run(e, prompt, spans, len(case["generated_ids"]))


@pytest.mark.parametrize("name,image", GREEDY_CASES)
def test_greedy_answer_equals_llama_cpp(engines, name, image):
    case, events = _answer(engines, name, image)
    ours = [ev.token for ev in events]
    gold = case["generated_ids"]
    i = next((k for k, (a, b) in enumerate(zip(ours, gold)) if a != b), None)
    if i is not None:
        top = sorted((lp for _, lp in case["steps"][i]["top_logprobs"]), reverse=True)
        assert top[0] - top[1] < 0.02, f"diverged at step {i}: ours {ours[i]}, llama.cpp {gold[i]}"


@pytest.mark.parametrize("name,image", GREEDY_CASES)
def test_top_logprobs_within_tolerance(engines, name, image):
    case, events = _answer(engines, name, image)
    worst = max_logprob_deviation(events, case["steps"])
    print(f"max |logprob difference| {worst:.4f}")      # reported with pytest -s
    assert worst <= 0.05, f"max |logprob difference| {worst:.4f}"


def test_same_image_twice_skips_the_encoder(engines):
    e = engines["mlp_f16"]
    case = _golden("mlp_f16", "checker_300x200.png")
    e.clear_cache()
    prompt, spans = build_prompt(e, case["apply_template_prompt"], [_image("checker_300x200.png")])
    first = [ev.token for ev in _run(e, prompt, spans, 8)]
    encoded = e.stats()["images_encoded"]
    e.clear_cache()                 # no prefix reuse: only the image store can help
    prompt, spans = build_prompt(e, case["apply_template_prompt"], [_image("checker_300x200.png")])
    hits = e.stats()["image_cache_hits"]
    second = [ev.token for ev in _run(e, prompt, spans, 8)]
    assert e.stats()["images_encoded"] == encoded
    assert e.stats()["image_cache_hits"] == hits + 1
    assert second == first


def test_image_longer_than_the_batch_is_split_across_batches(mmproj_dir, smollm2_path):
    case = _golden("mlp_f16", "grad_64x64.png")
    answers = []
    for n_batch in (1024, 100):       # the image is 576 rows
        e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_batch=n_batch, n_parallel=1, n_threads=2,
                   mmproj=str(mmproj_dir / "mmproj-synth-mlp-f16.gguf")))
        prompt, spans = build_prompt(e, case["apply_template_prompt"], [_image("grad_64x64.png")])
        answers.append([ev.token for ev in _run(e, prompt, spans, 8)])
        e.close()
    assert answers[0] == answers[1]


def test_gemma3_image_stays_in_one_batch(mmproj_dir, gemma3_path):
    # 256 bidirectional rows must share a batch: with -b 300 the text before the
    # image goes first, then the whole span, never a split span
    e = Engine(EngineConfig(gemma3_path, n_ctx=2048, n_batch=300, n_parallel=1, n_threads=2,
               mmproj=str(mmproj_dir / "mmproj-synth-gemma3-f16.gguf")))
    case = _golden("gemma3_f16", "grad_64x64.png")
    prompt, spans = build_prompt(e, "x " * 60 + case["apply_template_prompt"], [_image("grad_64x64.png")])
    seq_chunks = []
    e.add(Request("g", prompt, GREEDY, max_tokens=1, ignore_eos=True, images=spans))
    while e.has_work():
        before = e.scheduler.running[0].n_computed if e.scheduler.running else None
        e.step()
        after = e.scheduler.running[0].n_computed if e.scheduler.running else len(prompt)
        if before is not None:
            seq_chunks.append((before, after))
    span = spans[0]
    for lo, hi in seq_chunks:
        assert not (lo < span.start < hi < span.end) and not (span.start < lo < span.end)
    e.close()


def test_text_streams_keep_decoding_while_an_image_encodes(engines):
    # slots for 1 image request + 4 text streams, on gemma3_f16's files
    e = engines["gemma3_f16"]
    eng = Engine(EngineConfig(e.model_path, n_ctx=4096, n_batch=512, n_parallel=5, n_threads=2,
                 mmproj=e.vision.path))
    texts = {f"t{i}": eng.tokenizer.encode(p, add_special=True) for i, p in
             enumerate(["The capital of France is", "Once upon a time", "1, 2, 3,", "def fib(n):"])}
    solo = {}
    for rid, ids in texts.items():
        eng.clear_cache()
        eng.add(Request(rid, ids, GREEDY, max_tokens=12, ignore_eos=True))
        out = []
        while eng.has_work():
            out += [ev.token for ev in eng.step()]
        solo[rid] = out
    eng.clear_cache()
    case = _golden("gemma3_f16", "checker_300x200.png")
    prompt, spans = build_prompt(eng, case["apply_template_prompt"], [_image("checker_300x200.png")])
    for rid, ids in texts.items():
        eng.add(Request(rid, ids, GREEDY, max_tokens=12, ignore_eos=True))
    eng.add(Request("img", prompt, GREEDY, max_tokens=4, ignore_eos=True, images=spans))
    got = {rid: [] for rid in texts}
    stalled, longest, last = 0, 0.0, None
    while eng.has_work():
        running = [rid for rid in texts if len(got[rid]) < 12]
        t0 = time.perf_counter()
        events = eng.step()
        done = time.perf_counter()
        for ev in events:
            if ev.request_id in got:
                got[ev.request_id].append(ev.token)
        if running and got[running[0]] and not any(ev.request_id in running for ev in events):
            stalled += 1           # a step that gave a running text stream no token
        if any(ev.request_id in texts for ev in events):
            longest = max(longest, done - (last or t0))
            last = done
    eng.close()
    print(f"longest gap between text tokens while the image encoded: {longest * 1000:.0f} ms")
    assert got == solo
    assert stalled == 0


def test_image_embeddings_are_kept_on_the_first_text_layers_device(engines):
    # on the GPU when the model is offloaded (tests/test_gpu.py); here on the CPU
    e = engines["mlp_f16"]
    e.clear_cache()
    case = _golden("mlp_f16", "grad_64x64.png")
    prompt, spans = build_prompt(e, case["apply_template_prompt"], [_image("grad_64x64.png")])
    _run(e, prompt, spans, 1)
    emb = e.images.get(spans[0].key)
    assert emb.device is e.backend.cpu
    assert emb["embd"].ne[:2] == (e.model.n_embd, 576)


def test_a_tile_encodes_in_the_background_while_other_rows_run(engines):
    # the step that reaches an unencoded tile computes the text before it and
    # returns; the tile encodes on the vision worker and joins a later step
    loaded = engines["mlp_f16"]
    e = Engine(EngineConfig(loaded.model_path, n_ctx=4096, n_batch=512, n_parallel=1, n_threads=2,
               mmproj=loaded.vision.path))           # an empty image store
    case = _golden("mlp_f16", "rgba_160x120.png")
    prompt, spans = build_prompt(e, case["apply_template_prompt"], [_image("rgba_160x120.png")])
    encoded = e.stats()["images_encoded"]
    e.add(Request("img", prompt, GREEDY, max_tokens=len(case["generated_ids"]), ignore_eos=True,
                  images=spans, turn_starts=turn_starts(e, prompt, spans)))
    e.step()
    seq = e.scheduler.running[0]
    assert seq.n_computed == spans[0].start
    assert e.stats()["images_encoded"] == encoded          # not collected yet
    events = []
    while e.has_work():
        events += e.step()
    n_encoded = e.stats()["images_encoded"]
    e.close()
    assert n_encoded == encoded + 1
    assert [ev.token for ev in events] == case["generated_ids"]


def test_a_tile_that_fails_to_encode_ends_only_its_request(mmproj_dir, smollm2_path):
    # 4 image requests at once; one tile is corrupt (not a [3, H, W] array), as a
    # failing preprocessor or encoder would leave it: that request ends with an
    # error, the other 3 give exactly their answers alone, and no cell leaks
    mmproj = str(mmproj_dir / "mmproj-synth-mlp-f16.gguf")
    names = ["grad_64x64.png", "checker_300x200.png", "rgba_160x120.png", "tall_200x600.png"]
    bad = "rgba_160x120.png"

    def engine():
        return Engine(EngineConfig(smollm2_path, n_ctx=4096, n_batch=512, n_parallel=4, n_threads=2, mmproj=mmproj))

    def request(e, name):
        prompt, spans = build_prompt(e, _golden("mlp_f16", name)["apply_template_prompt"], [_image(name)])
        return Request(name, prompt, GREEDY, max_tokens=6, ignore_eos=True, images=spans)

    e = engine()
    solo = {}
    for name in names:
        if name != bad:
            e.clear_cache()
            solo[name] = tokens(generate_requests(e, [request(e, name)])[name])
    e.close()
    e = engine()                                     # an empty image store: every tile encodes
    requests = [request(e, name) for name in names]
    requests[names.index(bad)].images[0].tile = np.zeros((336, 336), dtype=np.float32)
    events = generate_requests(e, requests)
    stats = e.stats()
    e.close()
    assert events[bad][-1].finish_reason == "error" and "could not be encoded" in events[bad][-1].error
    assert {name: tokens(evs) for name, evs in events.items() if name != bad} == solo
    assert (stats["running"], stats["waiting"]) == (0, 0)
    assert stats["kv_used"] == sum(len(r.prompt) + 5 for r in requests if r.id != bad)   # kept for reuse
