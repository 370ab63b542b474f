"""Projector families paired with the llama text model synth-llama-smolvocab.gguf
(pixtral, mistral3, mlp_anyres, minicpmv) against llama.cpp 11434's llama-server.

Data: ../shared/golden/synth-vision (README section "Synthetic vision projectors not yet
in ggserve"): per family 8 images + one two-image request, each with the prompt token
count, 16 greedy tokens and their top-5 logprobs. JPEG images use the pixels llama.cpp's
stb_image decoded (images/decoded_stb). The default run checks one image per family and
the two-image request; `-m slow` checks every image (2048x2048 included).
Missing data is an error, never a skip.
"""

import numpy as np
import pytest
from PIL import Image

from engine_helpers import GREEDY, build_prompt, generate_requests, max_logprob_deviation, tokens, turn_starts
from ggserve.models.registry import ModelError
from ggserve.server.engine.engine import EngineConfig, Engine, Request
from synth_vision import CONFIGS, GOLDEN, LOGPROB_TOL, SYNTH, TWO, _cfg, _engine, _image, _mmproj, engines  # noqa: F401

FAMILIES = ["pixtral", "mistral3", "mlp_anyres", "minicpmv"]
DEFAULT_IMAGE = {"pixtral": "grad_64x64.png", "mistral3": "gray_37x53.png", "mlp_anyres": "tall_200x600.png",
                 "minicpmv": "shapes_1024x512.jpg"}


def _steps(case):
    return [dict(s, top_logprobs=[(t["id"], t["logprob"]) for t in s.get("top_logprobs", ())]) for s in case["steps"]]


def _check_case(engine, case):
    """Prompt token count, greedy tokens (near-tie rule) and top-5 logprobs of one golden request."""
    images = [_image(i["file"]) for i in case["images"]]
    prompt, spans = build_prompt(engine, case["apply_template_prompt"], images)
    assert len(prompt) == case["prompt_tokens"]
    assert [s.n for s in spans] == [c["n_tokens"] for c in case["image_chunks_from_server_log"]]
    # fresh: no cached prefix, no stored embedding (each image encoded and computed here)
    engine.clear_cache()
    engine.images.clear()
    events = generate_requests(engine, [Request("r", prompt, GREEDY, max_tokens=len(case["generated_ids"]),
                                                ignore_eos=True, images=spans,
                                                turn_starts=turn_starts(engine, prompt, spans))])["r"]
    ours, gold = tokens(events), case["generated_ids"]
    i = next((k for k, (a, b) in enumerate(zip(ours, gold)) if a != b), None)
    if i is not None:
        top = sorted((t["logprob"] for t in case["steps"][i]["top_logprobs"]), reverse=True)
        assert top[0] - top[1] < 0.02, f"diverged at step {i}: ours {ours[i]}, llama.cpp {gold[i]}"
    worst = max_logprob_deviation(events, _steps(case))
    print(f"max |logprob difference| {worst:.6f}")
    assert worst <= LOGPROB_TOL
    return ours


def _cases(slow: bool):
    for family in FAMILIES:
        for case in _cfg(family)["results"]:
            default = case["image"] in (DEFAULT_IMAGE[family], TWO)
            if default != slow:
                marks = [pytest.mark.slow] if slow else []
                yield pytest.param(family, case["image"], id=f"{family}-{case['image']}", marks=marks)


def _golden(family, image):
    return next(c for c in _cfg(family)["results"] if c["image"] == image)


@pytest.mark.parametrize("family,image", list(_cases(slow=False)))
def test_golden_image(engines, family, image):
    _check_case(engines(family), _golden(family, image))


@pytest.mark.parametrize("family,image", list(_cases(slow=True)))
def test_golden_image_slow(engines, family, image):
    _check_case(engines(family), _golden(family, image))


def test_every_golden_size_gives_llama_cpps_token_counts(engines):
    """Layout only (no compute): every image of every family, 2048x2048 included."""
    for family in FAMILIES:
        e = engines(family)
        for case in _cfg(family)["results"]:
            sizes = [(i["width"], i["height"]) for i in case["images"]]
            if len(sizes) == 1:
                assert e.vision.tokens_per_image(sizes[0]) == case["image_tokens"]
            images = [(f"{k:064x}", Image.new("RGB", s)) for k, s in enumerate(sizes)]
            prompt, _ = build_prompt(e, case["apply_template_prompt"], images)
            assert len(prompt) == case["prompt_tokens"], (family, case["image"])


def test_four_concurrent_requests_equal_their_solo_answers():
    names = ["grad_64x64.png", "gray_37x53.png", "rgba_160x120.png", "checker_300x200.jpg"]
    e = _engine("pixtral", n_parallel=4)
    try:
        reqs = []
        for k, name in enumerate(names):
            prompt, spans = build_prompt(e, _golden("pixtral", name)["apply_template_prompt"], [_image(name)])
            reqs.append(Request(f"r{k}", prompt, GREEDY, max_tokens=16, ignore_eos=True, images=spans,
                                turn_starts=turn_starts(e, prompt, spans)))
        together = generate_requests(e, reqs)
        for k, name in enumerate(names):
            assert tokens(together[f"r{k}"]) == _golden("pixtral", name)["generated_ids"], name
            # each row gets the kernel llama.cpp gives it alone (server/engine/kernel_parity.py):
            # batched decode rows of F16 weights take the one-row kernel, as alone
            assert max_logprob_deviation(together[f"r{k}"], _steps(_golden("pixtral", name))) <= LOGPROB_TOL, name
    finally:
        e.close()


def test_a_repeated_image_is_encoded_once(engines):
    e = engines("mistral3")
    case = _golden("mistral3", "rgba_160x120.png")
    e.clear_cache()
    e.images.clear()
    runs = []
    for _ in range(2):
        prompt, spans = build_prompt(e, case["apply_template_prompt"], [_image("rgba_160x120.png")])
        e.clear_cache()                 # no prefix reuse: only the image store can help
        before = e.stats()
        runs.append(tokens(generate_requests(e, [Request("r", prompt, GREEDY, max_tokens=4, ignore_eos=True,
                                                          images=spans)])["r"]))
        after = e.stats()
    assert after["images_encoded"] == before["images_encoded"]
    assert after["image_cache_hits"] == before["image_cache_hits"] + 1
    assert runs[0] == runs[1] == case["generated_ids"][:4]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_2048_image_fits_the_memory_reserved_at_load(engines, family):
    """Every tile of a 2048x2048 image (and of the extreme aspect ratios) needs no more
    compute memory than Engine reserved: reserving its graph again grows nothing."""
    e = engines(family)
    vm = e.vision
    reserved = dict(vm.backend.compute_bytes)
    for size in [(2048, 2048), (2048, 16), (16, 2048), (1, 1)]:
        plan = vm.plan(*size)
        for w, h in {tuple(t.shape[:0:-1]) for t in vm.preprocess(np.zeros((size[1], size[0], 3), np.uint8))}:
            g = vm.max_graph((w, h))
            try:
                vm.backend.reserve(g)
            finally:
                g.close()
            assert vm.backend.compute_bytes == reserved, (family, size, (w, h))
        assert plan.n_tiles >= 1


def test_wrong_pairs_are_refused_naming_both_files(smollm2_path):
    # SmolLM2-135M has n_embd 576; the projectors here give 128
    with pytest.raises(ModelError) as err:
        Engine(EngineConfig(smollm2_path, n_ctx=512, n_parallel=1, n_threads=2, mmproj=_mmproj("pixtral")))
    assert smollm2_path in str(err.value) and _mmproj("pixtral") in str(err.value)
