"""Where an engine's tensors live without a GPU: every weight and the KV cache on the
CPU, a tied output read from token_embd itself. The same attributes tests/test_gpu.py
reads on a GPU, so a rename shows here too and not only where a GPU is lent."""
from ggserve.server.engine.engine import EngineConfig, Engine


def test_without_offload_every_weight_and_the_kv_cache_live_on_the_cpu(smollm2_path):
    e = Engine(EngineConfig(smollm2_path, n_ctx=256, n_batch=64, n_parallel=1, n_gpu_layers=0))
    try:
        cpu = e.backend.cpu
        on_cpu = {name for b in e.loaded.weights.values() if b.device is cpu for name in b.tensors}
        assert set(e.loaded.gguf.tensors) == on_cpu
        kv = e.kv.nbytes_by_device()
        assert list(kv) == [cpu.name] and kv[cpu.name] > 0
        # SmolLM2 ties its output to token_embd: no copy without a GPU (llama.cpp's rule)
        assert e.model.output.name == "token_embd.weight"
    finally:
        e.close()
