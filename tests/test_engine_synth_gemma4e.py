"""Gemma 4 E (arch gemma4 with per-layer embeddings and shared KV layers, golden README
"Second batch"): what its layers keep in the KV cache against llama.cpp's report, and
the files it refuses. Its completions, batching and chats are in the shared synth tests
(test_engine_synth_dense.py, test_engine_synth_batching.py, test_server_synth_chat.py)."""
import json
import re

import pytest

from ggserve.models.registry import ModelError, model_class
from ggserve.native.gguf_file import GGUFFile
from synth_golden import SYNTH, engine, model_path

ARCH = "gemma4e"


def _llama_cpp_caches() -> dict:
    """llama.cpp's KV caches of gemma4e by kind ("non-SWA", "SWA"): (MiB, cells, layers, K MiB, V MiB)."""
    lines = json.loads((SYNTH / "out" / "load_summary.json").read_text())[ARCH]
    out, kind = {}, None
    for line in lines:
        if m := re.search(r"creating +(non-SWA|SWA) KV cache", line):
            kind = m.group(1)
        elif m := re.search(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers.*K \(f16\): +([\d.]+) MiB, "
                            r"V \(f16\): +([\d.]+) MiB", line):
            out[kind] = (float(m[1]), int(m[2]), int(m[3]), float(m[4]), float(m[5]))
    return out


def _build(meta_changes=None, drop=()):
    path = model_path(ARCH)
    f = GGUFFile(path)
    tensors = {name: t for name, t in f.tensors.items() if name not in drop}
    return model_class("gemma4", path)({**f.metadata, **(meta_changes or {})}, tensors, path)


def test_shared_layers_read_the_last_earlier_layer_of_their_kind():
    model = _build()
    assert model.swa == [True, True, True, False, True, False]
    assert model.kv_from == [0, 1, 2, 3, 2, 3]       # layer 4 (SWA) reads layer 2, layer 5 (global) layer 3
    specs = model.memory_layers(lambda il: "cpu")
    assert [s.kv_from for s in specs] == [-1, -1, -1, -1, 2, 3]
    assert [s.n_embd_k for s in specs] == [64, 64, 64, 64, 64, 64]      # 2 x 32 on SWA layers, 1 x 64 global
    assert [s.sliding_window for s in specs] == [32, 32, 32, 0, 32, 0]


def test_kv_cache_holds_what_llama_cpp_reports():
    """Nothing is stored for the shared layers; the global layer's cache and the
    sliding-window layers' ring (window + ubatch cells, llama.cpp's iSWA cache) are
    llama.cpp's to the byte."""
    caches = _llama_cpp_caches()
    e = engine(ARCH)
    try:
        mem = e.memory
        for kind, cache, layers in (("non-SWA", mem.kv, [3]), ("SWA", mem.swa, [0, 1, 2])):
            mib, cells, n_layers, k_mib, v_mib = caches[kind]
            assert [il for il, t in enumerate(cache.k) if t is not None] == layers
            assert [il for il, t in enumerate(cache.v) if t is not None] == layers
            assert (cache.size, n_layers) == (cells, len(layers))
            k = sum(t.nbytes for t in cache.k if t is not None) / 2**20
            v = sum(t.nbytes for t in cache.v if t is not None) / 2**20
            assert (round(k, 2), round(v, 2), round(k + v, 2)) == (k_mib, v_mib, mib)
        total = sum(mem.nbytes_by_device().values()) / 2**20
        assert round(total, 2) == round(caches["non-SWA"][0] + caches["SWA"][0], 2)      # 1.00 + 0.56 MiB
    finally:
        e.close()


def test_shared_layers_must_follow_a_sliding_window_and_a_global_layer():
    # llama.cpp reads n_layer_kv_from_start - 2 (SWA) and - 1 (global): with 3 shared
    # layers those would be layers 1 and 2, both sliding-window
    with pytest.raises(ModelError, match=r"synth-gemma4e-.*\.gguf: 3 shared KV layers need the two layers before "
                                         r"them to be sliding-window then global"):
        _build({"gemma4.attention.shared_kv_layers": 3})


@pytest.mark.parametrize("tensor", ["per_layer_token_embd.weight", "blk.5.inp_gate.weight", "blk.0.attn_k.weight",
                                    "blk.2.post_norm.weight"])
def test_missing_tensor_is_named(tensor):
    with pytest.raises(ModelError, match=rf"synth-gemma4e-.*\.gguf: missing tensor '{re.escape(tensor)}'"):
        _build(drop={tensor})


def test_shared_layers_need_no_k_projection():
    assert _build(drop={"blk.4.attn_k.weight", "blk.4.attn_k_norm.weight"}).layers[4].wk is None
