"""What ggserve holds in RAM at llama-server's defaults (issue 35; bench/memory.py measures
both servers): compute buffers no larger than llama-server 11434's (its load log:
tests/data/resident_memory), a KV cache whose pages become resident as cells are written
(llama.cpp clears its cache at load, which makes all of it resident), and no llguidance
vocabulary or grammar worker until a request has a grammar."""
import gc
import json
import os
import sys

import httpx
import pytest
from engine_helpers import generate
from server_harness import RunningServer

from ggserve.server.app import create_app
from ggserve.server.cli.main import config_from_args, serve_parser
from ggserve.server.engine.engine import Engine

HERE = os.path.dirname(__file__)
with open(os.path.join(HERE, "data", "resident_memory", "llama_server_11434.json"), encoding="utf-8") as _f:
    REF = json.load(_f)
MiB = 2**20


def model_path(name: str) -> str:
    sys.path.insert(0, os.path.join(HERE, "..", "bench"))
    try:
        import memory
    finally:
        sys.path.pop(0)
    path = str(memory.model_path(name))
    if not os.path.exists(path):
        pytest.skip(f"{name} is not here")
    return path


def defaults(name: str):
    """`ggserve serve -m MODEL -t 1`'s engine settings: everything else at its default, as
    bench/memory.py starts both servers."""
    return config_from_args(serve_parser().parse_args(["-m", model_path(name), "-t", "1"]))


def anonymous_bytes() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Anonymous:"))


@pytest.mark.parametrize("name", ["smollm2", "gemma3", "moe"])
def test_the_compute_buffer_is_no_larger_than_llama_servers(name):
    """SmolLM2's Q4_1 products quantize their rows to Q8_1 in a node of their own: as a copy
    into a new tensor each was a graph leaf, which ggml's allocator keeps for the whole graph
    (100 MiB where llama-server reserves 22.64)."""
    e = Engine(defaults(name))
    try:
        ref = REF["models"][name]
        assert (e.n_ctx, sum(e.memory.kv.nbytes_by_device().values()) / MiB) == (ref["n_ctx"], ref["kv_mib"][0])
        assert e.backend.compute_bytes["CPU"] / MiB <= ref["compute_mib"] * 1.01
    finally:
        e.close()


def test_the_kv_cache_takes_ram_for_the_cells_written_only():
    """SmolLM2's 8,192-cell cache (180 MiB) after a 200-token prompt: the process grows by
    less than half of it, weights, tokenizer, compute and the written cells included
    (llama-server's cache is resident from its start)."""
    gc.collect()
    before = anonymous_bytes()
    e = Engine(defaults("smollm2"))
    try:
        kv_bytes = sum(e.memory.kv.nbytes_by_device().values())
        prompt = e.tokenizer.encode("Write about the sea. " * 40)
        assert len(generate(e, {"sea": prompt}, 8)["sea"]) == 8
        grown = anonymous_bytes() - before
        assert kv_bytes == 180 * MiB and grown < kv_bytes / 2
    finally:
        e.close()


def test_a_server_holds_no_grammar_compiler_until_a_request_has_a_grammar():
    """llguidance's vocabulary and its compile worker (~250 MiB for Gemma 3's 262k tokens)
    come with the first grammar, as llama.cpp builds its llguidance tokenizer at first use."""
    args = serve_parser().parse_args(["-m", model_path("smollm2"), "-c", "512", "-np", "1", "-t", "1"])
    app = create_app(config_from_args(args))
    with RunningServer(app) as s:
        chat = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4, "temperature": 0}
        assert httpx.post(s.url + "/v1/chat/completions", json=chat, timeout=120).status_code == 200
        assert not app.state.service.grammars.built
        schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
        r = httpx.post(s.url + "/v1/chat/completions", timeout=120, json={**chat, "max_tokens": 40, "response_format": {
            "type": "json_schema", "json_schema": {"name": "c", "schema": schema}}})
        assert r.status_code == 200 and app.state.service.grammars.built
        assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"])["colour"], str)


def test_the_merges_live_in_the_tokenizers_native_tables_only():
    """SmolLM2's 48,900 merges (12.6 MiB of Python strings for a 151k-merge vocabulary) are
    dropped once the BPE tables hold them; Ollama's verbose /api/show still lists them, from
    the file."""
    path = model_path("smollm2")
    args = serve_parser().parse_args(["-m", path, "-c", "512", "-np", "1", "-t", "1"])
    app = create_app(config_from_args(args))
    with RunningServer(app) as s:
        loaded = app.state.service.engine.loaded
        assert "tokenizer.ggml.merges" not in loaded.gguf.metadata and loaded.tokenizer.vocab.merges == []
        # still llama-server's ids (tests/data/tokenize.json, en_hello)
        assert loaded.tokenizer.encode("Hello world", add_special=False) == [19556, 905]
        info = httpx.post(s.url + "/api/show", json={"model": "any", "verbose": True}, timeout=60).json()["model_info"]
        assert len(info["tokenizer.ggml.merges"]) == 48900


def test_the_token_texts_live_in_one_buffer():
    """The vocabulary's texts as one UTF-8 buffer with an end offset per id (TokenTexts:
    1.9 MiB for Qwen's 151,936 texts, 12.9 MiB as Python strings), the same texts by id as
    the file's list; the metadata drops its list, the chat template still gets BOS and EOS,
    and Ollama's verbose /api/show lists the texts from the file."""
    from ggserve.models.tokenizer import Tokenizer
    from ggserve.native.gguf_file import GGUFFile

    moe = Tokenizer.from_gguf(model_path("moe")).vocab.tokens
    assert len(moe) == 151936 and moe.nbytes < 2 * MiB
    path = model_path("smollm2")
    texts = GGUFFile(path).metadata["tokenizer.ggml.tokens"]
    args = serve_parser().parse_args(["-m", path, "-c", "512", "-np", "1", "-t", "1"])
    app = create_app(config_from_args(args))
    with RunningServer(app) as s:
        loaded = app.state.service.engine.loaded
        assert "tokenizer.ggml.tokens" not in loaded.gguf.metadata
        assert list(loaded.tokenizer.vocab.tokens) == texts and loaded.tokenizer.vocab.tokens[-1] == texts[-1]
        template = loaded.chat_template
        assert (template.bos_token, template.eos_token) == ("<|im_start|>", "<|im_end|>")
        info = httpx.post(s.url + "/api/show", json={"model": "any", "verbose": True}, timeout=60).json()["model_info"]
        assert info["tokenizer.ggml.tokens"] == texts


def test_the_bpe_tables_hold_texts_end_to_end_with_an_index_each():
    """Qwen's 151,936 token texts and 151,387 merges in the native BPE tables: one buffer and
    an open-addressing index each, under 6 MiB (two unordered_map<string, int> took ~25);
    the ids stay llama-server's (tests/test_tokenizer_synth.py, tests/test_tokenizer.py)."""
    from ggserve.models.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(model_path("moe"))
    assert tok._impl._core.nbytes < 6 * MiB
    assert tok.encode("Hello world", add_special=False) == [9707, 1879]
