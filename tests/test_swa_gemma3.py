"""Gemma 3 270M's 15 sliding-window layers (window 512) in llama.cpp's iSWA ring, its 3
global layers over the whole context: the KV cache as llama-server 11434 reports it at
its defaults and at the golden's settings (tests/data/swa_memory: make_reference.py and
README.md say how it was recorded). The golden prompts longer
than the window (long_prose, long_code: 611 and 982 tokens, the latter wrapping the
1,024-cell ring) are in test_engine_golden.py."""
import json
import pathlib

import pytest
from synth_golden import assert_kv_caches_as_llama_cpp, kv_caches_in_log

from ggserve.server.engine.engine import Engine, EngineConfig

DATA = pathlib.Path(__file__).parent / "data" / "swa_memory"
LOGS = json.loads((DATA / "gemma3_load_logs.json").read_text())
LAYERS = {"non-SWA": [5, 11, 17], "SWA": [il for il in range(18) if il % 6 != 5]}


@pytest.mark.parametrize("name,kw", [
    ("defaults", dict(n_ctx=0, n_parallel=4, kv_unified=True)),      # 32,768 cells; one 2,560-cell ring
    ("c4096_np1", dict(n_ctx=4096, n_parallel=1)),                   # 4,096 cells; a 1,024-cell ring
])
def test_kv_cache_holds_what_llama_server_reports(gemma3_path, name, kw):
    e = Engine(EngineConfig(gemma3_path, n_threads=2, **kw))
    try:
        assert_kv_caches_as_llama_cpp(e.memory, kv_caches_in_log(LOGS[name]["log"]), LAYERS)
    finally:
        e.close()
