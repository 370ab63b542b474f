"""Qwen2.5-VL (qwen2.5vl_merger + the qwen2vl text model), Qwen3-VL (qwen3vl_merger +
the qwen3vl text model, deepstack), Gemma 4 vision (gemma4v + the llama text model,
non-causal image spans) and Llama 4 vision (llama4 tiles + overview, pixel shuffle, + the
llama text model) against llama.cpp 11434's llama-server.

Data: ../shared/golden/synth-vision (README section "Synthetic vision projectors not yet
in ggserve"): per family 8 images + one two-image request, each with the prompt token
count, the positions the prompt takes (M-RoPE: an image advances them by max(gx, gy)),
16 greedy tokens and their top-5 logprobs. JPEGs use the pixels llama.cpp's stb_image
decoded. The default run checks one image per family and the two-image request;
`-m slow` checks every image (2048x2048 included: about 5 minutes for qwen25vl).
Missing data is an error, never a skip.
"""

import numpy as np
import pytest
from PIL import Image

from engine_helpers import GREEDY, generate_requests, max_logprob_deviation, tokens
from ggserve.models.registry import ModelError
from ggserve.models.vision.arrange import TileSpan, mrope_positions
from ggserve.native import ggml
from ggserve.server.engine.engine import EngineConfig, Engine, Request
from ggserve.server.engine.memory.kv_cache import KVCache
from ggserve.models.memory import LayerKV
from ggserve.server.chat.prompts import PromptBuilder
from synth_vision import CONFIGS, GOLDEN, LOGPROB_TOL, SYNTH, TWO, _cfg, _engine, _image, _mmproj, engines  # noqa: F401

FAMILIES = ["qwen25vl", "qwen3vl", "gemma4v", "llama4"]
MROPE = ("qwen25vl", "qwen3vl")
DEFAULT_IMAGE = {"qwen25vl": "grad_64x64.png", "qwen3vl": "tall_200x600.png", "gemma4v": "gray_37x53.png",
                 "llama4": "tall_200x600.png"}


def _golden(family, image):
    return next(c for c in _cfg(family)["results"] if c["image"] == image)


def _steps(case):
    return [dict(s, top_logprobs=[(t["id"], t["logprob"]) for t in s.get("top_logprobs", [])]) for s in case["steps"]]


def _request(engine, rid, case, images, max_tokens=16):
    p = PromptBuilder.for_engine(engine).build(case["apply_template_prompt"], images)
    return p, Request(rid, p.tokens, GREEDY, max_tokens=max_tokens, ignore_eos=True, images=p.images,
                      positions=p.positions, turn_starts=p.turn_starts)


def _check_case(engine, case):
    """Prompt token count and positions, greedy tokens (near-tie rule), top-5 logprobs."""
    prompt, req = _request(engine, "r", case, [_image(i["file"]) for i in case["images"]])
    assert len(prompt.tokens) == case["prompt_tokens"]
    assert [s.n for s in prompt.images] == [c["n_tokens"] for c in case["image_chunks_from_server_log"]]
    n_pos = len(prompt.tokens) if prompt.positions is None else int(prompt.positions[0].max()) + 1
    assert n_pos == case["prompt_n_positions"]
    engine.clear_cache()
    engine.images.clear()
    events = generate_requests(engine, [req])["r"]
    ours, gold = tokens(events), case["generated_ids"]
    i = next((k for k, (a, b) in enumerate(zip(ours, gold)) if a != b), None)
    if i is not None:
        top = sorted((t["logprob"] for t in case["steps"][i]["top_logprobs"]), reverse=True)
        assert top[0] - top[1] < 0.02, f"diverged at step {i}: ours {ours[i]}, llama.cpp {gold[i]}"
    worst = max_logprob_deviation(events, _steps(case))
    print(f"max |logprob difference| {worst:.6f}")
    assert worst <= LOGPROB_TOL


def _cases(slow: bool):
    for family in FAMILIES:
        for case in _cfg(family)["results"]:
            default = case["image"] in (DEFAULT_IMAGE[family], TWO)
            if default != slow:
                yield pytest.param(family, case["image"], id=f"{family}-{case['image']}",
                                   marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("family,image", list(_cases(slow=False)))
def test_golden_image(engines, family, image):
    _check_case(engines(family), _golden(family, image))


@pytest.mark.parametrize("family,image", list(_cases(slow=True)))
def test_golden_image_slow(engines, family, image):
    _check_case(engines(family), _golden(family, image))


def test_every_golden_size_gives_llama_cpps_token_and_position_counts(engines):
    """Layout only (no compute): every image of every family, 2048x2048 included."""
    for family in FAMILIES:
        e = engines(family)
        for case in _cfg(family)["results"]:
            sizes = [(i["width"], i["height"]) for i in case["images"]]
            if len(sizes) == 1:
                assert e.vision.tokens_per_image(sizes[0]) == case["image_tokens"]
            images = [(f"{k:064x}", Image.new("RGB", s)) for k, s in enumerate(sizes)]
            p = PromptBuilder.for_engine(e).build(case["apply_template_prompt"], images)
            assert len(p.tokens) == case["prompt_tokens"], (family, case["image"])
            n_pos = len(p.tokens) if p.positions is None else int(p.positions[0].max()) + 1
            assert n_pos == case["prompt_n_positions"], (family, case["image"])


def test_mrope_positions_follow_mtmd():
    # 2 text tokens, a 3x2 image, 1 text token, a 1x1... grid image, 2 text tokens
    spans = [TileSpan(2, 6, "a:0", None, False, grid=(3, 2)), TileSpan(9, 2, "b:0", None, False, grid=(1, 2))]
    pos = mrope_positions(13, spans)
    assert pos[:, :2].T.tolist() == [[0, 0, 0, 0], [1, 1, 1, 0]]
    # image rows: (p0, p0 + row, p0 + col, 0), p0 = 2
    assert pos[:, 2:8].T.tolist() == [[2, 2, 2, 0], [2, 2, 3, 0], [2, 2, 4, 0],
                                      [2, 3, 2, 0], [2, 3, 3, 0], [2, 3, 4, 0]]
    # the image advanced the position by max(3, 2) = 3
    assert pos[:, 8].tolist() == [5, 5, 5, 0]
    assert pos[:, 9:11].T.tolist() == [[6, 6, 6, 0], [6, 7, 6, 0]]
    assert pos[:, 11:].T.tolist() == [[8, 8, 8, 0], [9, 9, 9, 0]]


def test_image_rows_at_one_position_are_causal_on_the_grid():
    """llama.cpp's M-RoPE causal mask: rows sharing their first position see the cells
    before them in row-major grid order, not after (is_2d_gt)."""
    b = ggml.Backend(n_threads=1, use_gpu=False)
    try:
        kv = KVCache(b, [LayerKV(8, 8, b.cpu)], 256, n_pos=4)
        pos = mrope_positions(6, [TileSpan(1, 4, "a:0", None, False, grid=(2, 2))])
        cells = np.arange(6)
        kv.commit(cells, np.zeros(6, dtype=np.int64), pos)
        mask = kv.step_values(cells, np.zeros(6, dtype=np.int64), pos[0], None, [(0, 6, 0, 256, 6)])["kq_mask"]
        visible = (mask.reshape(6, 256)[:, :6] == 0).astype(int)
        assert visible.tolist() == np.tril(np.ones((6, 6), dtype=int)).tolist()
    finally:
        b.close()


def test_four_concurrent_requests_equal_their_solo_answers():
    """Positions per request and deepstack slices of several images in one step."""
    names = ["grad_64x64.png", "gray_37x53.png", "rgba_160x120.png", "tall_200x600.png"]
    e = _engine("qwen3vl", n_parallel=4)
    try:
        reqs = [_request(e, f"r{k}", _golden("qwen3vl", n), [_image(n)])[1] for k, n in enumerate(names)]
        together = generate_requests(e, reqs)
        for k, name in enumerate(names):
            assert tokens(together[f"r{k}"]) == _golden("qwen3vl", name)["generated_ids"], name
            worst = max_logprob_deviation(together[f"r{k}"], _steps(_golden("qwen3vl", name)))
            print(name, f"batched: max |logprob difference| {worst:.6f}")
            assert worst <= LOGPROB_TOL
    finally:
        e.close()


def test_a_repeated_image_is_encoded_once(engines):
    e = engines("qwen25vl")
    case = _golden("qwen25vl", "rgba_160x120.png")
    e.clear_cache()
    e.images.clear()
    runs = []
    for _ in range(2):
        _, req = _request(e, "r", case, [_image("rgba_160x120.png")], max_tokens=4)
        e.clear_cache()                 # no prefix reuse: only the image store can help
        before = e.stats()
        runs.append(tokens(generate_requests(e, [req])["r"]))
        after = e.stats()
    assert after["images_encoded"] == before["images_encoded"]
    assert after["image_cache_hits"] == before["image_cache_hits"] + 1
    assert runs[0] == runs[1] == case["generated_ids"][:4]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_2048_image_fits_the_memory_reserved_at_load(engines, family):
    """The tile of a 2048x2048 image (and of extreme aspect ratios) needs no more compute
    memory than Engine reserved: reserving its graph again grows nothing."""
    e = engines(family)
    vm = e.vision
    reserved = dict(vm.backend.compute_bytes)
    for size in [(2048, 2048), (4096, 28), (28, 4096), (1, 1)]:
        tiles = vm.preprocess(np.zeros((size[1], size[0], 3), np.uint8))
        for w, h in {(t.shape[2], t.shape[1]) for t in tiles}:
            g = vm.max_graph((w, h))
            try:
                vm.backend.reserve(g)
            finally:
                g.close()
            assert vm.backend.compute_bytes == reserved, (family, size, (w, h))


@pytest.mark.parametrize("family", FAMILIES)
def test_wrong_pairs_are_refused_naming_both_files(family):
    # the llama text model has n_embd 128, the qwen2vl one 32; the projectors give 32 / 96 / 128
    text = str(SYNTH / "models" / ("synth-qwen2vl.gguf" if family in ("gemma4v", "llama4")
                                   else "synth-llama-smolvocab.gguf"))
    with pytest.raises(ModelError) as err:
        Engine(EngineConfig(text, n_ctx=512, n_parallel=1, n_threads=2, mmproj=_mmproj(family)))
    assert text in str(err.value) and _mmproj(family) in str(err.value)


def test_served_chat_with_an_image_equals_llama_server():
    """The HTTP path (prompt builder on the service's thread, positions through the
    request) gives llama-server's answer for a Qwen2.5-VL image."""
    import base64

    import httpx

    from ggserve.server.app import ServerConfig, create_app
    from server_harness import RunningServer

    case = _golden("qwen25vl", "gray_37x53.png")
    cfg = ServerConfig(model=str(SYNTH / "models" / _cfg("qwen25vl")["text_model"]), mmproj=_mmproj("qwen25vl"),
                       n_ctx=8192, n_parallel=1, n_batch=512, n_threads=2)
    url = "data:image/png;base64," + base64.b64encode((GOLDEN / "images" / "gray_37x53.png").read_bytes()).decode()
    body = {k: v for k, v in case["request"].items() if k not in ("messages", "return_tokens", "verbose")}
    body["messages"] = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                     {"type": "text", "text": "Describe this image."}]}]
    with RunningServer(create_app(cfg)) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=300).json()
    assert r["usage"]["prompt_tokens"] == case["prompt_tokens"]
    content = r["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == [s["token"] for s in case["steps"]]
    assert max(abs(c["logprob"] - s["logprob"]) for c, s in zip(content, case["steps"])) <= LOGPROB_TOL
