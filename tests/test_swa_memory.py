"""Sliding-window layers in llama.cpp's iSWA ring (server/engine/memory/swa_ring.py) on
gpt-oss and Gemma 4 (synthetic golden), --swa-full, and --fit (server/engine/memory/sizing.py).
KV sizes against llama.cpp's load log (synth_golden.llama_cpp_kv_caches); greedy answers
against its goldens, the prompts longer than the window (long_code: 1,231 tokens over a
32-token window) included. Gemma 3's are in test_swa_gemma3.py."""
import dataclasses
import logging

import pytest
from engine_helpers import generate
from synth_golden import assert_kv_caches_as_llama_cpp, assert_same_as_llama_cpp, case, engine

from ggserve.server.engine.engine import Engine, EngineConfig
from ggserve.server.engine.memory import sizing

LAYERS = {"gpt-oss": {"non-SWA": [1, 3], "SWA": [0, 2]},       # 2.00 + 0.38 MiB
          "gemma4": {"non-SWA": [3], "SWA": [0, 1, 2]}}        # 1.00 + 0.56 MiB


@pytest.mark.parametrize("arch", LAYERS)
def test_kv_cache_holds_what_llama_cpp_reports(arch):
    e = engine(arch)
    try:
        assert_kv_caches_as_llama_cpp(e.memory, arch, LAYERS[arch])
    finally:
        e.close()


@pytest.mark.parametrize("arch", LAYERS)
def test_a_prompt_longer_than_the_ring_answers_as_llama_cpp(arch):
    """long_code's 1,231 tokens wrap the 768-cell ring (window 32 + ubatch 512, padded)."""
    golden = case(arch, "long_code")
    e = engine(arch)
    try:
        assert len(golden["prompt_ids"]) > e.memory.swa.size
        out = generate(e, {"r": golden["prompt_ids"]}, len(golden["generated_ids"]))["r"]
        assert_same_as_llama_cpp(out, golden)
    finally:
        e.close()


def test_a_unified_cache_shares_one_ring_as_llama_cpp():
    """-np 4 -kvu: one ring of pad(4 x 32 + 512, 256) cells for every slot
    (llama-kv-cache-iswa.cpp size_swa), not one per slot; requests one after another
    take the cells the earlier ones' windows no longer show (the ring stays full) and
    answer as llama.cpp answers them alone."""
    e = engine("gemma4", n_parallel=4, kv_unified=True)
    try:
        assert (e.memory.swa.size, e.memory.swa.n_regions, e.kv.size) == (768, 1, 4096)
        for key in ("long_code", "story", "code_fib"):
            golden = case("gemma4", key)
            assert_same_as_llama_cpp(generate(e, {key: golden["prompt_ids"]}, 48)[key], golden)
            assert e.memory.swa.n_used == 768
    finally:
        e.close()


def test_separate_slots_get_a_ring_each():
    e = engine("gemma4", n_parallel=2, n_ctx=4096)
    try:
        assert (e.memory.swa.size, e.memory.swa.n_regions) == (2 * 768, 2)
    finally:
        e.close()


def test_swa_full_keeps_every_layer_over_the_whole_context():
    """--swa-full: no ring; the sliding-window layers' K/V over all 4,096 cells (2 x 32 x
    2 bytes per cell for K and for V, 3 layers) beside the global layer's 1.00 MiB."""
    e = engine("gemma4", swa_full=True)
    try:
        assert e.memory.swa is None
        assert sum(e.memory.nbytes_by_device().values()) == 2**20 + 3 * 4096 * 2 * 64 * 2
        golden = case("gemma4", "long_code")
        out = generate(e, {"r": golden["prompt_ids"]}, len(golden["generated_ids"]))["r"]
        assert_same_as_llama_cpp(out, golden)
    finally:
        e.close()


# --fit: SmolLM2 (-c 0: its 8,192-token training context; 30 layers x 2 x 192 f16 values
# = 23,040 bytes of K and V per cell), one unified cache

def _smollm2(smollm2_path, **kw):
    return Engine(EngineConfig(smollm2_path, n_ctx=0, n_parallel=4, kv_unified=True, n_threads=2, **kw))


def test_fit_reduces_a_context_too_large_for_the_target(smollm2_path, caplog):
    """Memory for weights + 6,000 cells: llama.cpp's interpolation between --fit-ctx 4096
    and 8192 gives 6,000, rounded down to 256: 5,888."""
    e = _smollm2(smollm2_path)
    try:
        weights = sum(e.loaded.weight_bytes(d) for d in e.loaded.backend.devices)
        specs = e.model.memory_layers(e.loaded.device_of_layer)
        cfg = dataclasses.replace(e.cfg, fit=True)
        total = weights + 6000 * 23040 + cfg.fit_target_mb * 2**20
        with caplog.at_level(logging.INFO, logger="ggserve.engine"):
            assert sizing.fit_context(cfg, e.loaded, specs, 8192, total=total) == (5888, 5888)
        assert "--fit: context size reduced from 8192 to 5888 -> 50 MiB less memory in total" in caplog.text
        assert sizing.fit_context(cfg, e.loaded, specs, 8192, total=total + 3000 * 23040) == (8192, 8192)
        assert sizing.fit_context(dataclasses.replace(cfg, n_ctx=8192), e.loaded, specs, 8192, total=total) \
            == (8192, 8192)          # a context the user set is not changed
    finally:
        e.close()


def test_fit_never_goes_below_fit_ctx(smollm2_path, caplog):
    """A target larger than the machine: the engine starts with --fit-ctx's 2,048 tokens."""
    with caplog.at_level(logging.INFO, logger="ggserve.engine"):
        e = _smollm2(smollm2_path, fit=True, fit_target_mb=sizing.host_memory() // 2**20, fit_ctx=2048)
    try:
        assert (e.kv_size, e.n_ctx) == (2048, 2048)
        assert "--fit: context size reduced from 8192 to 2048" in caplog.text
    finally:
        e.close()
