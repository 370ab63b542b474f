"""Audio chunks are scheduled like image tiles: encoded in the background while text
streams keep decoding. On one engine (Gemma 4's mmproj: vision and audio encoders, the
synth-audio text model), 4 text streams run beside 4 audio requests and, for comparison,
beside 4 image requests, the media prompts built on a thread of their own while the streams
decode, as the server's prompt thread builds them: every text and audio answer equals the
one it gets alone, no step leaves a running text stream without a token; the same for 4 clips
on a Whisper-family file (Ultravox: one 3000-frame chunk each).

What used to pause the streams beside audio was the prompt thread: the log-mel front end
(hundreds of ms a clip, holding the GIL for tens of ms at a time) ran there, beside the
engine's thread. A clip's log-mel is now computed when its first chunk is encoded, on the
encoder's worker thread (models/audio/model.py ClipMel), which takes one CPU thread while
the text steps take the others; building an audio prompt costs the prompt thread less than
an image prompt, and the text streams' longest pauses beside audio are as short as
beside images (summed over runs that alternate A B B A, up to the machine's noise)."""
import functools
import hashlib
import queue
import threading
import time

import pytest
import synth_audio as SA
from engine_helpers import GREEDY
from PIL import Image

from ggserve.models.audio.decode import Clip, decode
from ggserve.server.chat.prompts import PromptBuilder
from ggserve.server.engine.engine import Request

CLIPS = ["tone_16k_mono_1s.wav", "noise_8k_mono_0s5.wav", "chord_32k_stereo_2s.flac", "chirp_44k1_stereo_3s.wav"]
IMAGES = ["checker_300x200.png", "grad_64x64.png", "gray_37x53.png", "tall_200x600.png"]
TEXTS = ["The capital of France is", "Once upon a time", "1, 2, 3,", "def fib(n):"]
N_TEXT, N_MEDIA = 48, 4          # the streams decode while every media request arrives and runs


@pytest.fixture(scope="module")
def engine():
    # one thread: on a loaded machine two threads' barriers stretch every step (tests/test_engine_stall.py)
    e = SA.engine("gemma4", n_parallel=8, n_batch=512, n_threads=1)
    yield e
    e.close()


@pytest.fixture(scope="module")
def builder(engine):
    return PromptBuilder.for_engine(engine)


def _audio(builder, name, family="gemma4"):
    """The prompt the server builds for a golden clip: its bytes decoded, then laid out."""
    data = SA.clip_bytes(name)
    prompt = builder.build(SA.case(family, name)["apply_template_prompt"],
                           [(hashlib.sha256(data).hexdigest(), Clip(decode(data), 16000))])
    return prompt.tokens, prompt.images


def _image(builder, name):
    template = SA.case("gemma4", SA.IMAGE_AND_AUDIO)["apply_template_prompt"].replace("<__media__>", "", 1)
    path = SA.GOLDEN / "images" / name
    img = Image.open(path)
    img.load()
    prompt = builder.build(template, [(hashlib.sha256(path.read_bytes()).hexdigest(), img.convert("RGB"))])
    return prompt.tokens, prompt.images


def _texts(e):
    return {f"t{i}": e.tokenizer.encode(p, add_special=True) for i, p in enumerate(TEXTS)}


def _alone(e, rid, prompt, spans, n):
    e.clear_cache()
    e.images.clear()
    e.add(Request(rid, prompt, GREEDY, max_tokens=n, ignore_eos=True, images=spans))
    out = []
    while e.has_work():
        out += [ev.token for ev in e.step() if ev.token is not None]
    return out


def _together(e, builder, make, names):
    """4 text streams decode while a thread of their own builds the media prompts (make(builder,
    name)) and queues them, added between steps as the service adds them.
    -> (answers, steps that left a running text stream without a token, longest pause in s)."""
    e.clear_cache()
    e.images.clear()
    texts = _texts(e)
    for rid, prompt in texts.items():
        e.add(Request(rid, prompt, GREEDY, max_tokens=N_TEXT, ignore_eos=True))
    arrived: queue.Queue = queue.Queue()

    def build():
        for name in names:
            tokens, spans = make(builder, name)
            arrived.put(Request(f"m-{name}", tokens, GREEDY, max_tokens=N_MEDIA, ignore_eos=True, images=spans))
    got = {rid: [] for rid in [*texts, *(f"m-{n}" for n in names)]}
    for ev in e.step():                    # the streams' prompts: they decode when the media arrive
        got[ev.request_id].append(ev.token)
    stalled, longest, last = 0, 0.0, None
    prompts = threading.Thread(target=build)
    prompts.start()
    while e.has_work() or prompts.is_alive() or not arrived.empty():
        while not arrived.empty():
            e.add(arrived.get())
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
    prompts.join()
    return got, stalled, longest


def test_four_audio_requests_beside_four_text_streams(engine, builder):
    solo = {rid: _alone(engine, rid, prompt, [], N_TEXT) for rid, prompt in _texts(engine).items()}
    for name in CLIPS:      # prompts are built anew for each run: a span's mel is dropped once encoded
        solo[f"m-{name}"] = _alone(engine, f"m-{name}", *_audio(builder, name), N_MEDIA)
    runs = {}
    for kind in ("audio", "images", "images", "audio") * 2:
        make, names = (_audio, CLIPS) if kind == "audio" else (_image, IMAGES)
        got, stalled, pause = _together(engine, builder, make, names)
        runs.setdefault(kind, []).append(pause)
        assert stalled == 0
        assert all(got[rid] == solo[rid] for rid in got if rid.startswith("t") or kind == "audio")
    print("longest pause of the text streams (ms): beside audio "
          f"{', '.join(f'{p * 1000:.0f}' for p in runs['audio'])}; beside images "
          f"{', '.join(f'{p * 1000:.0f}' for p in runs['images'])}")
    # the runs alternate (A B B A) so that a change in the machine's load falls on both kinds; these
    # clips and images pause the streams alike (each run's worst step beside them: 15-30 ms on a loaded
    # 2-core machine, 3-8 ms on a quiet one, where a few ms of noise is a large ratio), so the bound
    # leaves room for that noise, 1.5x and 10 ms a run, and catches a stall of the old kind (the
    # log-mel on the prompt thread held the GIL 37 ms at a time: every run's pause 37 ms or more)
    assert sum(runs["audio"]) <= 1.5 * sum(runs["images"]) + 0.010 * len(runs["audio"])


def test_four_whisper_family_clips_beside_four_text_streams():
    # Ultravox: each clip one 3000-frame chunk under 30 s of padding, 375 rows, as llama.cpp cuts it
    e = SA.engine("ultravox", n_parallel=8, n_batch=512, n_threads=1)
    try:
        builder = PromptBuilder.for_engine(e)
        solo = {rid: _alone(e, rid, prompt, [], N_TEXT) for rid, prompt in _texts(e).items()}
        for name in CLIPS:
            solo[f"m-{name}"] = _alone(e, f"m-{name}", *_audio(builder, name, "ultravox"), N_MEDIA)
        got, stalled, _ = _together(e, builder, functools.partial(_audio, family="ultravox"), CLIPS)
    finally:
        e.close()
    assert got == solo
    assert stalled == 0


def test_an_audio_prompt_is_built_without_its_log_mel(builder):
    # the front end runs when the first chunk is encoded, on the encoder's thread
    _, spans = _audio(builder, "chirp_44k1_stereo_3s.wav")
    assert spans and all(not s.tile.clip.computed for s in spans)


def test_building_audio_prompts_costs_the_prompt_thread_less_than_image_prompts(builder):
    def cpu_seconds(make, names):
        t0 = time.thread_time()
        for name in names:
            make(builder, name)
        return time.thread_time() - t0
    longest_clip = "steps_16k_mono_30s.wav"           # a whole 30 s chunk among the clips
    clips = [*CLIPS[1:], longest_clip]
    cpu_seconds(_audio, clips), cpu_seconds(_image, IMAGES)     # first builds: tables, caches
    audio = min(cpu_seconds(_audio, clips), cpu_seconds(_audio, clips))
    images = min(cpu_seconds(_image, IMAGES), cpu_seconds(_image, IMAGES))
    print(f"prompt thread CPU for 4 prompts: audio {audio * 1000:.1f} ms, images {images * 1000:.1f} ms")
    assert audio < images


def test_a_clip_whose_embeddings_are_cached_is_never_turned_into_a_log_mel(engine, builder):
    name = "chord_32k_stereo_2s.flac"
    first = _alone(engine, "first", *_audio(builder, name), N_MEDIA)
    engine.clear_cache()                   # the prompt again from the start, its embeddings from the store
    tokens, spans = _audio(builder, name)
    engine.add(Request("again", tokens, GREEDY, max_tokens=N_MEDIA, ignore_eos=True, images=spans))
    again = []
    while engine.has_work():
        again += [ev.token for ev in engine.step() if ev.token is not None]
    assert again == first
    assert not any(s.tile is not None and s.tile.clip.computed for s in spans)
