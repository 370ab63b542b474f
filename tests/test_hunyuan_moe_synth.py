"""Tencent Hunyuan MoE (hunyuan-moe: hunyuan-dense's attention without the NTK alpha,
a shared expert plus softmax top-2 routed experts in every layer; no chat template, so
chats as ChatML) against llama.cpp 11434 on a tiny random-weight model that
tests/data/hunyuan_moe/make_model.py writes at
test time (golden.json beside it: llama-server's answers on that very file, by
sha256, made with the shared make_synth_golden.py; README.md there says how)."""
import json
import pathlib

import pytest
import synth_arch_checks as checks

from ggserve.models.registry import ModelError, model_class
from ggserve.models.tokenizer import Tokenizer
from ggserve.native.gguf_file import GGUFFile

DATA = pathlib.Path(__file__).resolve().parent / "data" / "hunyuan_moe"
GOLDEN = json.loads((DATA / "golden.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> str:
    return checks.write_model(tmp_path_factory, DATA, GOLDEN, "hunyuan-moe")


@pytest.fixture(scope="module")
def tokenizer(model_file) -> Tokenizer:
    return Tokenizer.from_gguf(model_file)


@pytest.fixture(scope="module")
def engine(model_file):
    e = checks.make_engine(model_file)
    yield e
    e.close()


def test_the_model_loads_with_shared_and_routed_experts_and_the_files_rope_base(model_file):
    meta = GGUFFile(model_file).metadata
    assert meta["general.architecture"] == "hunyuan-moe" and meta["hunyuan-moe.rope.scaling.alpha"] == 2.0
    m = model_class("hunyuan-moe")(meta, GGUFFile(model_file).tensors, model_file)
    assert (m.n_layer, m.n_head, m.n_head_kv, m.head_dim, m.n_ff, m.n_ff_shexp) == (4, 4, 2, 16, 64, 128)
    assert m.rope_scaling.freq_base == 10000.0                     # llama.cpp: "freq_base_train = 10000.0"
    assert (m.routing.n_expert, m.routing.n_used, m.routing.norm_weights) == (8, 2, True)
    assert all(L.experts is not None and L.shexp is not None and L.q_norm is not None for L in m.layers)


def test_a_missing_shared_expert_tensor_names_the_file_and_the_tensor(model_file):
    f = GGUFFile(model_file)
    tensors = {k: v for k, v in f.tensors.items() if k != "blk.1.ffn_down_shexp.weight"}
    with pytest.raises(ModelError, match=r"hunyuan-moe.*blk\.1\.ffn_down_shexp\.weight"):
        model_class("hunyuan-moe")(f.metadata, tensors, model_file)


def test_kv_cache_holds_what_llama_cpp_reports(model_file):
    checks.check_kv_cache(model_file, GOLDEN)


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
    # 1231 tokens: 20 chunks of 64
    checks.check_long_prompt(model_file, checks.completion(GOLDEN, "long_code"), whole_batch=2048)


def test_served_chat_equals_llama_servers_message(model_file):
    checks.check_served_chat(model_file, GOLDEN, "system_user")
