"""Command R7B (cohere2, golden README "Second batch"): its layer pattern and what its
layers keep in the KV cache against llama.cpp's report. Its completions, batching and
chats are in the shared synth tests (test_engine_synth_dense.py,
test_engine_synth_batching.py, test_chat_template_synth.py, test_server_synth_chat.py)."""
from ggserve.models.registry import model_class
from ggserve.native.gguf_file import GGUFFile
from synth_golden import assert_kv_caches_as_llama_cpp, engine, model_path

ARCH = "cohere2"


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
    e = engine(ARCH)
    try:
        assert_kv_caches_as_llama_cpp(e.memory, ARCH, {"non-SWA": [3], "SWA": [0, 1, 2]})     # 0.25 + 0.14 MiB
    finally:
        e.close()
