"""IBM Granite MoE (granitemoe: RoPE attention, softmax top-2 experts and a shared
expert, Granite's embedding/attention/residual/logit scales) against llama.cpp 11434
on a tiny random-weight model that tests/data/granitemoe/make_model.py writes at
test time (golden.json beside it: llama-server's answers on that very file, by
sha256, made with the shared make_synth_golden.py; README.md there says how)."""
import datetime
import json
import pathlib

import pytest
import synth_arch_checks as checks

import ggserve.models.chat_template as ct
from ggserve.models.registry import ModelError, model_class
from ggserve.models.tokenizer import Tokenizer
from ggserve.native.gguf_file import GGUFFile

DATA = pathlib.Path(__file__).resolve().parent / "data" / "granitemoe"
GOLDEN = json.loads((DATA / "golden.json").read_text(encoding="utf-8"))
# Granite 3.3's template prints today's date: render as on the day llama-server did
DAY = datetime.datetime.fromisoformat(GOLDEN["date"]).replace(hour=12)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> str:
    return checks.write_model(tmp_path_factory, DATA, GOLDEN, "granitemoe")


@pytest.fixture(scope="module")
def tokenizer(model_file) -> Tokenizer:
    return Tokenizer.from_gguf(model_file)


@pytest.fixture(scope="module")
def engine(model_file):
    e = checks.make_engine(model_file)
    yield e
    e.close()


def test_the_model_loads_as_granitemoe_with_its_experts_and_scales(model_file):
    meta = GGUFFile(model_file).metadata
    assert meta["general.architecture"] == "granitemoe"
    m = model_class("granitemoe")(meta, GGUFFile(model_file).tensors, model_file)
    assert (m.n_layer, m.n_head, m.n_head_kv, m.head_dim, m.n_rot) == (4, 4, 2, 16, 16)
    assert (m.routing.n_expert, m.routing.n_used, m.routing.norm_weights) == (8, 2, True)
    assert all(L.experts is not None and L.shexp is not None for L in m.layers)
    assert (m.embd_scale, m.kq_scale, m.logit_scale) == (12.0, 0.0078125, 8.0)
    assert m.residual_scale == pytest.approx(0.22)


def test_a_missing_expert_tensor_names_the_file_and_the_tensor(model_file):
    f = GGUFFile(model_file)
    tensors = {k: v for k, v in f.tensors.items() if k != "blk.2.ffn_up_exps.weight"}
    with pytest.raises(ModelError, match=r"granitemoe.*blk\.2\.ffn_up_exps\.weight"):
        model_class("granitemoe")(f.metadata, tensors, model_file)


def test_kv_cache_holds_what_llama_cpp_reports(model_file):
    checks.check_kv_cache(model_file, GOLDEN)


@pytest.mark.parametrize("entry", GOLDEN["tokenize"], ids=lambda e: e["key"])
def test_tokenization_equals_llama_servers(tokenizer, entry):
    checks.check_tokenization(tokenizer, entry)


@pytest.mark.parametrize("case", GOLDEN["completions"], ids=lambda c: c["key"])
def test_completion_equals_llama_cpp(engine, case):
    checks.check_completion(engine, case)


@pytest.mark.parametrize("conv", GOLDEN["chats"], ids=lambda c: c["key"])
def test_chat_renders_tokenizes_and_answers_as_llama_server(engine, conv, monkeypatch):
    monkeypatch.setattr(ct, "now", lambda: DAY)
    checks.check_chat(engine, conv, render_template=True)


def test_four_concurrent_streams_equal_each_alone(engine):
    checks.check_concurrent_streams(engine, GOLDEN)


def test_a_prompt_longer_than_a_batch_equals_it_unbatched(model_file):
    # 928 tokens: 15 chunks of 64
    checks.check_long_prompt(model_file, checks.completion(GOLDEN, "long_code"), whole_batch=1024)


def test_served_chat_equals_llama_servers_message(model_file):
    checks.check_served_chat(model_file, GOLDEN, "system_user")
