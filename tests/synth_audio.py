"""The synth-audio golden data (../shared/golden/synth-audio: llama.cpp 11434's answers on
synthetic audio mmproj files; its README says how they were made) and engines on its
files, shared by the audio tests (not a test module itself). Missing data is an error."""
import hashlib
import json
import pathlib  # noqa: F401  (tests reach it as SA.pathlib)

from PIL import Image

from ggserve.models.audio.decode import Clip, decode

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "shared" / "golden"
SYNTH = GOLDEN / "synth-audio"
DOC = json.loads((SYNTH / "out" / "audio_chat.json").read_text())
TEXT_MODEL = SYNTH / "models" / "synth-llama-smolvocab-audio.gguf"
FAMILIES = ("ultravox", "voxtral", "qwen2a", "gemma4")
TWO = "tone_16k_mono_1s.wav+speech_espeak_22k_mono.wav"
IMAGE_AND_AUDIO = "img:checker_300x200.png+tone_16k_mono_1s.wav"   # gemma4: both encoders of one mmproj
NEAR_TIE = 0.05               # the rule: greedy text equal up to llama.cpp's first gap < 0.05
LOGPROB_TOL = 0.01


def config(family: str) -> dict:
    return DOC["configs"][f"synth_audio_{family}"]


def mmproj(family: str) -> str:
    return str(SYNTH / "mmproj" / config(family)["mmproj"])


def case(family: str, audio: str) -> dict:
    return next(r for r in config(family)["results"] if r["audio"] == audio)


def clip_bytes(name: str) -> bytes:
    return (SYNTH / "audio" / name).read_bytes()


def media(case: dict) -> list:
    """(sha256 of the file bytes, decoded Clip or PIL image) of a golden request, in order."""
    out = []
    for m in case["media"]:
        if m.get("kind") == "image":
            data = (GOLDEN / "images" / m["file"]).read_bytes()
            img = Image.open(GOLDEN / "images" / m["file"])
            img.load()
            out.append((hashlib.sha256(data).hexdigest(), img.convert("RGB")))
        else:
            data = clip_bytes(m["file"])
            out.append((hashlib.sha256(data).hexdigest(), Clip(decode(data), 16000)))
    return out


def engine(family: str, **kw):
    """An engine on the family's mmproj, set up as llama-server ran it (-c 4096 -np 1 -t 2)."""
    from ggserve.server.engine.engine import Engine, EngineConfig

    args = dict(n_ctx=4096, n_batch=2048, n_parallel=1, n_threads=2, mmproj=mmproj(family))
    args.update(kw)
    return Engine(EngineConfig(str(TEXT_MODEL), **args))


def first_near_tie(case: dict) -> int:
    """The first step where llama.cpp's top-2 gap is below NEAR_TIE (len(steps) if none)."""
    for i, s in enumerate(case["steps"]):
        top = sorted((t["logprob"] for t in s.get("top_logprobs", ())), reverse=True)     # none: no probs given
        if len(top) > 1 and top[0] - top[1] < NEAR_TIE:
            return i
    return len(case["steps"])
