"""Gemma 2 (gemma2: sliding-window attention on layers 0 and 2, global on 1 and 3,
softcapped attention and output logits, pre and post norms, GeGLU) against llama.cpp
11434 on a tiny random-weight model that tests/data/gemma2/make_model.py writes at
test time (golden.json beside it: llama-server's answers on that very file, by
sha256, made with the shared make_synth_golden.py; README.md there says how)."""
import json
import pathlib

import pytest
import synth_arch_checks as checks
from synth_golden import assert_kv_caches_as_llama_cpp, kv_caches_in_log

from ggserve.models.registry import ModelError, model_class
from ggserve.models.tokenizer import Tokenizer
from ggserve.native.gguf_file import GGUFFile

DATA = pathlib.Path(__file__).resolve().parent / "data" / "gemma2"
GOLDEN = json.loads((DATA / "golden.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> str:
    return checks.write_model(tmp_path_factory, DATA, GOLDEN, "gemma2")


@pytest.fixture(scope="module")
def tokenizer(model_file) -> Tokenizer:
    return Tokenizer.from_gguf(model_file)


@pytest.fixture(scope="module")
def engine(model_file):
    e = checks.make_engine(model_file)
    yield e
    e.close()


def test_the_model_loads_as_gemma2_with_its_windows_softcaps_and_scales(model_file):
    meta = GGUFFile(model_file).metadata
    assert meta["general.architecture"] == "gemma2"
    m = model_class("gemma2")(meta, GGUFFile(model_file).tensors, model_file)
    assert (m.n_layer, m.n_head, m.n_head_kv, m.head_dim, m.n_ff) == (4, 4, 2, 16, 128)
    assert (m.swa_layers, m.window) == ([True, False, True, False], 32)      # pattern 2: llama.cpp's default
    assert (m.attn_softcap, m.final_softcap, m.q_scale, m.kq_scale, m.embd_scale) == (50.0, 30.0, 0.25, 1.0, 8.0)
    assert m.output is m.tok_embd and all(L.attn_post_norm is not None and L.ffn_post_norm is not None for L in m.layers)


def test_a_missing_post_norm_names_the_file_and_the_tensor(model_file):
    f = GGUFFile(model_file)
    tensors = {k: v for k, v in f.tensors.items() if k != "blk.1.post_ffw_norm.weight"}
    with pytest.raises(ModelError, match=r"gemma2.*blk\.1\.post_ffw_norm\.weight"):
        model_class("gemma2")(f.metadata, tensors, model_file)


def test_kv_caches_hold_what_llama_cpp_reports(model_file):
    # llama-server's two caches: global layers 1, 3 (4096 cells); sliding layers 0, 2 (a 32-token window + a
    # 512-row ubatch, padded: 768 cells)
    e = checks.make_engine(model_file, n_ctx=4096, n_parallel=1)                # as llama-server ran it
    try:
        assert_kv_caches_as_llama_cpp(e.memory, kv_caches_in_log(GOLDEN["kv_cache_log"]),
                                      {"non-SWA": [1, 3], "SWA": [0, 2]})
    finally:
        e.close()


@pytest.mark.parametrize("entry", GOLDEN["tokenize"], ids=lambda e: e["key"])
def test_tokenization_equals_llama_servers(tokenizer, entry):
    checks.check_tokenization(tokenizer, entry)


@pytest.mark.parametrize("case", GOLDEN["completions"], ids=lambda c: c["key"])
def test_completion_equals_llama_cpp(engine, case):
    checks.check_completion(engine, case)


@pytest.mark.parametrize("conv", GOLDEN["chats"], ids=lambda c: c["key"])
def test_chat_renders_tokenizes_and_answers_as_llama_server(engine, conv):
    checks.check_chat(engine, conv)


def test_four_concurrent_streams_equal_each_alone(engine):
    checks.check_concurrent_streams(engine, GOLDEN)


def test_a_prompt_longer_than_a_batch_equals_it_unbatched(model_file):
    # 675 tokens: 11 chunks of 64, each past the 32-token window, wrapping the 256-cell ring
    checks.check_long_prompt(model_file, checks.completion(GOLDEN, "long_prose"), whole_batch=1024)


def test_served_chat_equals_llama_servers_message(model_file):
    checks.check_served_chat(model_file, GOLDEN, "multi_turn")
