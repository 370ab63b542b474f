"""Baidu ERNIE 4.5, dense (ernie4_5) and MoE (ernie4_5-moe: a dense first layer, then
softmax top-2 experts chosen with the exp_probs_b selection bias, plus a shared
expert), against llama.cpp 11434 on two tiny random-weight models that
tests/data/ernie4_5/make_model.py writes at test time (golden.json and
golden_moe.json beside it: llama-server's answers on those very files, by sha256,
made with the shared make_synth_golden.py; README.md there says how)."""
import json
import pathlib

import pytest
import synth_arch_checks as checks

from ggserve.models.registry import ModelError, model_class
from ggserve.models.tokenizer import Tokenizer
from ggserve.native.gguf_file import GGUFFile

DATA = pathlib.Path(__file__).resolve().parent / "data" / "ernie4_5"
GOLDEN = {arch: json.loads((DATA / name).read_text(encoding="utf-8"))
          for arch, name in (("ernie4_5", "golden.json"), ("ernie4_5-moe", "golden_moe.json"))}
ARCHS = list(GOLDEN)


def _cases(field: str) -> list:
    return [pytest.param(arch, c, id=f"{arch}-{c['key']}") for arch in ARCHS for c in GOLDEN[arch][field]]


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, str]:
    return {arch: checks.write_model(tmp_path_factory, DATA, golden, "ernie4_5", moe=arch == "ernie4_5-moe")
            for arch, golden in GOLDEN.items()}


@pytest.fixture(scope="module")
def engines(model_files):
    es = {arch: checks.make_engine(path) for arch, path in model_files.items()}
    yield es
    for e in es.values():
        e.close()


def _load(path: str, tensors=None):
    f = GGUFFile(path)
    return model_class(f.metadata["general.architecture"])(f.metadata, f.tensors if tensors is None else tensors, path)


def test_the_dense_model_loads_as_ernie4_5(model_files):
    m = _load(model_files["ernie4_5"])
    assert (m.arch, m.n_layer, m.n_head, m.n_head_kv, m.head_dim, m.n_rot, m.n_ff) == ("ernie4_5", 4, 4, 2, 16, 16, 128)
    assert m.routing is None and all(L.experts is None for L in m.layers)
    assert m.rope_scaling.freq_base == 500000.0


def test_the_moe_model_loads_with_a_dense_lead_experts_selection_bias_and_shared_expert(model_files):
    m = _load(model_files["ernie4_5-moe"])
    assert (m.routing.n_expert, m.routing.n_used, m.routing.norm_weights, m.n_ff_exp, m.n_ff_shexp) == (8, 2, True, 64, 64)
    assert [L.experts is not None for L in m.layers] == [False, True, True, True]       # leading_dense_block_count 1
    assert all(L.experts.probs_b is not None and L.shexp is not None for L in m.layers[1:])


def test_a_missing_expert_tensor_names_the_file_and_the_tensor(model_files):
    path = model_files["ernie4_5-moe"]
    tensors = {k: v for k, v in GGUFFile(path).tensors.items() if k != "blk.2.ffn_down_exps.weight"}
    with pytest.raises(ModelError, match=r"ernie4_5-moe.*blk\.2\.ffn_down_exps\.weight"):
        _load(path, tensors)


@pytest.mark.parametrize("arch", ARCHS)
def test_kv_cache_holds_what_llama_cpp_reports(model_files, arch):
    checks.check_kv_cache(model_files[arch], GOLDEN[arch])


@pytest.mark.parametrize("entry", GOLDEN["ernie4_5"]["tokenize"], ids=lambda e: e["key"])
def test_tokenization_equals_llama_servers(model_files, entry):
    checks.check_tokenization(Tokenizer.from_gguf(model_files["ernie4_5"]), entry)


@pytest.mark.parametrize("arch,case", _cases("completions"))
def test_completion_equals_llama_cpp(engines, arch, case):
    checks.check_completion(engines[arch], case)


@pytest.mark.parametrize("arch,conv", _cases("chats"))
def test_chat_renders_tokenizes_and_answers_as_llama_server(engines, arch, conv):
    checks.check_chat(engines[arch], conv, render_template=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_four_concurrent_streams_equal_each_alone(engines, arch):
    checks.check_concurrent_streams(engines[arch], GOLDEN[arch])


@pytest.mark.parametrize("arch", ARCHS)
def test_a_prompt_longer_than_a_batch_equals_it_unbatched(model_files, arch):
    # 1042 tokens: 17 chunks of 64
    checks.check_long_prompt(model_files[arch], checks.completion(GOLDEN[arch], "long_code"), whole_batch=2048)


@pytest.mark.parametrize("arch", ARCHS)
def test_served_chat_equals_llama_servers_message(model_files, arch):
    checks.check_served_chat(model_files[arch], GOLDEN[arch], "system_user")
