"""The synthetic-model golden data of ../shared/golden/synth (llama.cpp 11434 on tiny
random-weight GGUFs with real vocabularies and chat templates; its README says how
they were made). Missing data is an error, never a skip."""
import functools
import json
import pathlib

SYNTH = pathlib.Path(__file__).resolve().parents[2] / "shared" / "golden" / "synth"


def _json(name: str) -> dict:
    path = SYNTH / "out" / name
    assert path.is_file(), f"golden data missing: {path}"
    return json.loads(path.read_text(encoding="utf-8"))


@functools.cache
def completions() -> dict:
    """synth_completions.json: 7 prompts x 48 greedy tokens with top-5 logprobs per arch."""
    return _json("synth_completions.json")


@functools.cache
def chat() -> dict:
    """synth_chat.json: 3 conversations per arch (/apply-template + /v1/chat/completions)."""
    return _json("synth_chat.json")


@functools.cache
def tokenize() -> dict:
    """synth_tokenize.json: the corpus strings x 3 variants for each vocabulary."""
    return _json("synth_tokenize.json")


def case(arch: str, key: str) -> dict:
    """The golden completion `key` of `arch`."""
    return next(c for c in completions()["models"][arch] if c["key"] == key)


def engine(arch: str, **kw):
    """An engine on `arch`'s synth model, set up as llama-server ran it (prompts over
    512 tokens cut into 512-row ubatches), on 2 threads."""
    from ggserve.server.engine.engine import EngineConfig, Engine

    kw.setdefault("n_ctx", 4096)
    kw.setdefault("n_batch", 512)
    kw.setdefault("n_parallel", 1)
    return Engine(EngineConfig(model_path(arch), n_threads=2, **kw))


def model_path(arch: str) -> str:
    """The GGUF llama.cpp ran for `arch` (by general.architecture, e.g. "qwen3")."""
    files = [p for p in (SYNTH / "models").glob(f"synth-{arch}-*.gguf")]
    assert len(files) == 1, f"want one synth model for {arch!r} in {SYNTH / 'models'}, found {files}"
    return str(files[0])


def steps(case: dict) -> list[dict]:
    """A completion's steps in the shape of tests/data/completions.json (what
    engine_helpers.max_logprob_deviation reads): top_logprobs as [id, logprob] pairs."""
    return [{"id": s["id"], "probs_available": s["probs_available"],
             "top_logprobs": [[t["id"], t["logprob"]] for t in s.get("top_logprobs", [])]} for s in case["steps"]]
