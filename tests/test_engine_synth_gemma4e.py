"""Gemma 4 E (arch gemma4 with per-layer embeddings and shared KV layers, golden README
"Second batch"): what its layers keep in the KV cache against llama.cpp's report, and
the files it refuses. Its completions, batching and chats are in the shared synth tests
(test_engine_synth_dense.py, test_engine_synth_batching.py, test_server_synth_chat.py)."""
import re

import pytest

from ggserve.models.registry import ModelError, model_class
from ggserve.native.gguf_file import GGUFFile
from synth_golden import assert_kv_caches_as_llama_cpp, engine, model_path

ARCH = "gemma4e"


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
    """Nothing is stored for the shared layers (4, 5); the global layer's cache and the
    sliding-window layers' ring (window + ubatch cells, llama.cpp's iSWA cache) are
    llama.cpp's to the byte."""
    e = engine(ARCH)
    try:
        assert_kv_caches_as_llama_cpp(e.memory, ARCH, {"non-SWA": [3], "SWA": [0, 1, 2]})     # 1.00 + 0.56 MiB
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
