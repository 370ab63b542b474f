"""The synthetic-model golden data of ../shared/golden/synth (llama.cpp 11434 on tiny
random-weight GGUFs with real vocabularies and chat templates; its README says how
they were made). Missing data is an error, never a skip."""
import functools
import json
import os
import pathlib

# GGSERVE_GOLDEN_SYNTH: a copy of it elsewhere (the GPU machine gets only what travels)
SYNTH = pathlib.Path(os.environ.get("GGSERVE_GOLDEN_SYNTH")
                     or pathlib.Path(__file__).resolve().parents[2] / "shared" / "golden" / "synth")


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


NEAR_TIE = 0.02       # accepted divergence: llama.cpp's own top-2 gap below this
LOGPROB_TOL = 0.01


def top2_gap(step: dict) -> float:
    top = sorted((t["logprob"] for t in step["top_logprobs"]), reverse=True)
    return top[0] - top[1]


def assert_same_as_llama_cpp(events, golden: dict) -> None:
    """Greedy ids equal up to a near tie of llama.cpp's; top-5 logprobs within
    LOGPROB_TOL up to there (engine_helpers.max_logprob_deviation)."""
    from engine_helpers import max_logprob_deviation, tokens

    ours, gold = tokens(events), golden["generated_ids"]
    i = next((i for i, (a, b) in enumerate(zip(ours, gold)) if a != b), None)
    if i is not None:
        step = golden["steps"][i]
        assert step["probs_available"] and top2_gap(step) < NEAR_TIE, f"diverged at step {i}: {ours[i]} vs {gold[i]}"
    else:
        assert ours == gold
    n = len(gold) if i is None else i
    worst = max_logprob_deviation(events[:n], steps(golden)[:n])
    print(f"max |logprob difference| {worst:.5f}")       # reported with pytest -s
    assert worst <= LOGPROB_TOL


def llama_cpp_kv_caches(arch: str) -> dict:
    """llama.cpp's KV caches of arch by kind ("non-SWA", "SWA"), from its load log:
    (MiB, cells, layers, K MiB, V MiB)."""
    return kv_caches_in_log(_json("load_summary.json")[arch])


def kv_caches_in_log(lines: list[str]) -> dict:
    """The KV caches a llama.cpp load log reports, by kind (as llama_cpp_kv_caches)."""
    import re

    out, kind = {}, None
    for line in lines:
        if m := re.search(r"creating +(non-SWA|SWA) KV cache", line):
            kind = m.group(1)
        elif m := re.search(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers.*K \(f16\): +([\d.]+) MiB, "
                            r"V \(f16\): +([\d.]+) MiB", line):
            out[kind] = (float(m[1]), int(m[2]), int(m[3]), float(m[4]), float(m[5]))
    return out


def assert_kv_caches_as_llama_cpp(memory, arch: str | dict, layers: dict[str, list[int]]) -> None:
    """The global cache and the sliding-window ring hold K and V for these layers
    (by kind), in llama.cpp's cells and MiB (arch's, or these caches of kv_caches_in_log)."""
    caches = llama_cpp_kv_caches(arch) if isinstance(arch, str) else arch
    for kind, cache in (("non-SWA", memory.kv), ("SWA", memory.swa)):
        mib, cells, n_layers, k_mib, v_mib = caches[kind]
        assert [il for il, t in enumerate(cache.k) if t is not None] == layers[kind]
        assert [il for il, t in enumerate(cache.v) if t is not None] == layers[kind]
        assert (cache.size, n_layers) == (cells, len(layers[kind]))
        k = sum(t.nbytes for t in cache.k if t is not None) / 2**20
        v = sum(t.nbytes for t in cache.v if t is not None) / 2**20
        assert (round(k, 2), round(v, 2), round(k + v, 2)) == (k_mib, v_mib, mib)
    total = sum(memory.nbytes_by_device().values()) / 2**20
    assert round(total, 2) == round(caches["non-SWA"][0] + caches["SWA"][0], 2)
