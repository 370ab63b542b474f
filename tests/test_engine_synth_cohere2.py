"""Command R7B (cohere2, golden README "Second batch"): its layer pattern and what its
layers keep in the KV cache against llama.cpp's report. Its completions, batching and
chats are in the shared synth tests (test_engine_synth_dense.py,
test_engine_synth_batching.py, test_chat_template_synth.py, test_server_synth_chat.py)."""
import json
import re

from ggserve.models.registry import model_class
from ggserve.native.gguf_file import GGUFFile
from synth_golden import SYNTH, engine, model_path

ARCH = "cohere2"


def _llama_cpp_caches() -> dict:
    """llama.cpp's KV caches of cohere2 by kind ("non-SWA", "SWA"): (MiB, cells, layers, K MiB, V MiB)."""
    lines = json.loads((SYNTH / "out" / "load_summary.json").read_text())[ARCH]
    out, kind = {}, None
    for line in lines:
        if m := re.search(r"creating +(non-SWA|SWA) KV cache", line):
            kind = m.group(1)
        elif m := re.search(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers.*K \(f16\): +([\d.]+) MiB, "
                            r"V \(f16\): +([\d.]+) MiB", line):
            out[kind] = (float(m[1]), int(m[2]), int(m[3]), float(m[4]), float(m[5]))
    return out


def test_every_fourth_layer_is_global_without_rope_and_the_head_is_tied():
    path = model_path(ARCH)
    f = GGUFFile(path)
    model = model_class(ARCH, path)(f.metadata, f.tensors, path)
    assert model.swa_layers == [True, True, True, False]
    assert [s.sliding_window for s in model.memory_layers(lambda il: "cpu")] == [32, 32, 32, 0]
    assert all(s.window_cache for s in model.memory_layers(lambda il: "cpu")[:3])
    assert model.output is model.tok_embd and model.logit_scale == 0.25 and abs(model.eps - 1e-5) < 1e-12


def test_kv_cache_holds_what_llama_cpp_reports():
    """The global layer's cache and the sliding-window layers' ring (window + ubatch
    cells, llama.cpp's iSWA cache) are llama.cpp's to the byte."""
    caches = _llama_cpp_caches()
    e = engine(ARCH)
    try:
        mem = e.memory
        for kind, cache, layers in (("non-SWA", mem.kv, [3]), ("SWA", mem.swa, [0, 1, 2])):
            mib, cells, n_layers, k_mib, v_mib = caches[kind]
            assert [il for il, t in enumerate(cache.k) if t is not None] == layers
            assert (cache.size, n_layers) == (cells, len(layers))
            k = sum(t.nbytes for t in cache.k if t is not None) / 2**20
            v = sum(t.nbytes for t in cache.v if t is not None) / 2**20
            assert (round(k, 2), round(v, 2), round(k + v, 2)) == (k_mib, v_mib, mib)
        total = sum(mem.nbytes_by_device().values()) / 2**20
        assert round(total, 2) == round(caches["non-SWA"][0] + caches["SWA"][0], 2)      # 0.25 + 0.14 MiB
    finally:
        e.close()
