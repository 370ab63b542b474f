"""Audio chunks are scheduled like image tiles: encoded in the background while text
streams keep decoding. On one engine (Gemma 4's mmproj: vision and audio encoders, the
synth-audio text model), 4 text streams run beside 4 audio requests and, for comparison,
beside 4 image requests: every text and audio answer equals the one it gets alone, no
step leaves a running text stream without a token. The text streams' longest pauses beside audio and
beside images are printed; they are compared side by side (A B B A) in bench/serve.py's
audio workload, not here (a shared 2-core machine's timings are too noisy to assert)."""
import time

import pytest
import synth_audio as SA
from engine_helpers import GREEDY, build_prompt

from ggserve.server.engine.engine import Request

CLIPS = ["tone_16k_mono_1s.wav", "noise_8k_mono_0s5.wav", "chord_32k_stereo_2s.flac", "chirp_44k1_stereo_3s.wav"]
IMAGES = ["checker_300x200.png", "grad_64x64.png", "gray_37x53.png", "tall_200x600.png"]
TEXTS = ["The capital of France is", "Once upon a time", "1, 2, 3,", "def fib(n):"]
N_TEXT, N_MEDIA = 8, 4


@pytest.fixture(scope="module")
def engine():
    e = SA.engine("gemma4", n_parallel=8, n_batch=512)
    yield e
    e.close()


def _image_requests(e):
    import hashlib

    from PIL import Image
    template = SA.case("gemma4", SA.IMAGE_AND_AUDIO)["apply_template_prompt"].replace("<__media__>", "", 1)
    out = {}
    for name in IMAGES:
        path = SA.GOLDEN / "images" / name
        img = Image.open(path).convert("RGB")
        prompt, spans = build_prompt(e, template, [(hashlib.sha256(path.read_bytes()).hexdigest(), img)])
        out[f"img-{name}"] = (prompt, spans)
    return out


def _audio_requests(e):
    return {f"aud-{c}": build_prompt(e, SA.case("gemma4", c)["apply_template_prompt"], SA.media(SA.case("gemma4", c)))
            for c in CLIPS}


def _texts(e):
    return {f"t{i}": (e.tokenizer.encode(p, add_special=True), []) for i, p in enumerate(TEXTS)}


def _alone(e, rid, prompt, spans, n):
    e.clear_cache()
    e.images.clear()
    e.add(Request(rid, prompt, GREEDY, max_tokens=n, ignore_eos=True, images=spans))
    out = []
    while e.has_work():
        out += [ev.token for ev in e.step() if ev.token is not None]
    return out


def _together(e, texts, media):
    """-> (answers, steps that left a running text stream without a token, longest pause in s)."""
    e.clear_cache()
    e.images.clear()
    for rid, (prompt, spans) in texts.items():
        e.add(Request(rid, prompt, GREEDY, max_tokens=N_TEXT, ignore_eos=True))
    for rid, (prompt, spans) in media.items():
        e.add(Request(rid, prompt, GREEDY, max_tokens=N_MEDIA, ignore_eos=True, images=spans))
    got = {rid: [] for rid in [*texts, *media]}
    stalled, longest, last = 0, 0.0, None
    while e.has_work():
        running = [rid for rid in texts if got[rid] and len(got[rid]) < N_TEXT]
        t0 = time.perf_counter()
        events = e.step()
        done = time.perf_counter()
        for ev in events:
            if ev.token is not None:
                got[ev.request_id].append(ev.token)
        if running and not any(ev.request_id in running for ev in events):
            stalled += 1
        if any(ev.request_id in texts for ev in events):
            longest = max(longest, done - (last or t0))
            last = done
    return got, stalled, longest


def test_four_audio_requests_beside_four_text_streams(engine):
    # prompts are built anew for each run: a span's pixels or mel are dropped once encoded
    solo = {}
    for make in (_texts, _audio_requests):
        for rid, (prompt, spans) in make(engine).items():
            solo[rid] = _alone(engine, rid, prompt, spans, N_TEXT if rid.startswith("t") else N_MEDIA)
    got_a, stalled_a, pause_a = _together(engine, _texts(engine), _audio_requests(engine))
    got_i, stalled_i, pause_i = _together(engine, _texts(engine), _image_requests(engine))
    print(f"longest pause of the text streams: beside audio {pause_a * 1000:.0f} ms, "
          f"beside images {pause_i * 1000:.0f} ms")
    assert got_a == {rid: solo[rid] for rid in got_a}
    assert all(got_i[rid] == solo[rid] for rid in _texts(engine))
    assert stalled_a == 0 and stalled_i == 0
