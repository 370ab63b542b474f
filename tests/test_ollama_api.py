"""Ollama's API with the official `ollama` client, against a router over two real models
(SmolLM2 and Gemma 3), each in its own child. Greedy answers equal /v1/chat/completions on
the same model; raw /api/generate gives llama-server's greedy tokens (tests/data/completions.json)."""
from __future__ import annotations

import json
import math
import pathlib
import time

import httpx
import ollama
import pytest
from router_harness import models_dir, router, statuses

GOLDEN = json.loads((pathlib.Path(__file__).parent / "data" / "completions.json").read_text())["models"]
GREEDY = {"temperature": 0, "num_predict": 12}
HELLO = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path, gemma3_path):
    path = models_dir(tmp_path_factory.mktemp("ollama"), smollm2_path, gemma3_path, broken=False)
    with router(path, models_max=2, child_args=("--embeddings", "--pooling", "mean")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=180)


def openai_answer(url: str, model: str, messages: list[dict]) -> str:
    r = httpx.post(url + "/v1/chat/completions", timeout=180, json={
        "model": model, "messages": messages, "temperature": 0, "max_tokens": GREEDY["num_predict"]})
    return r.json()["choices"][0]["message"]["content"]


def test_list_names_both_models_with_their_gguf_details(client):
    models = {m.model: m.details for m in client.list().models}
    assert set(models) == {"smollm2", "gemma3"}
    assert (models["smollm2"].family, models["smollm2"].quantization_level) == ("llama", "Q4_1")
    assert (models["gemma3"].family, models["gemma3"].quantization_level) == ("gemma3", "Q4_K_M")


@pytest.mark.parametrize("model", ["smollm2", "gemma3:latest"])
def test_chat_greedy_equals_v1_chat_completions(server, client, model):
    got = client.chat(model=model, messages=HELLO, options=GREEDY)
    assert got.message.content == openai_answer(server.url, model.split(":")[0], HELLO)
    assert (got.done, got.done_reason, got.eval_count) == (True, "length", 12)
    assert got.prompt_eval_count > 0 and got.total_duration > got.eval_duration > 0


def test_chat_streamed_joins_to_the_same_answer(client):
    parts = list(client.chat(model="smollm2", messages=HELLO, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == "length"
    whole = client.chat(model="smollm2", messages=HELLO, options=GREEDY).message.content
    assert "".join(p.message.content for p in parts) == whole and len(parts) > 2


def test_format_schema_constrains_the_answer(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}},
              "required": ["colour"]}
    got = client.chat(model="smollm2", messages=HELLO, format=schema, options={"temperature": 0, "num_predict": 24})
    assert json.loads(got.message.content)["colour"] in ("red", "blue")


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_raw_generate_gives_llama_cpp_greedy_tokens_and_the_context(client, model):
    golden = GOLDEN[model][0]
    got = client.generate(model=model, prompt=golden["prompt"], raw=True, options=GREEDY)
    assert got.context == golden["prompt_ids"] + golden["generated_ids"][:12]


def test_generate_templates_the_prompt_as_chat_does(server, client):
    got = client.generate(model="gemma3", prompt=HELLO[0]["content"], options=GREEDY)
    assert got.response == openai_answer(server.url, "gemma3", HELLO)
    following = client.generate(model="gemma3", prompt="And three more.", context=got.context, options=GREEDY)
    assert following.context[:len(got.context)] == got.context and following.eval_count == 12


def test_embed_gives_unit_vectors_equal_to_v1_embeddings(server, client):
    got = client.embed(model="smollm2", input=["a cat", "a dog"])
    ref = httpx.post(server.url + "/v1/embeddings", timeout=120,
                     json={"model": "smollm2", "input": ["a cat", "a dog"]}).json()["data"]
    assert len(got.embeddings) == 2 and len(got.embeddings[0]) == 576
    for vec, r in zip(got.embeddings, ref):
        assert math.isclose(sum(x * x for x in vec), 1.0, rel_tol=1e-5)
        assert max(abs(a - b) for a, b in zip(vec, r["embedding"])) < 1e-6
    legacy = client.embeddings(model="smollm2", prompt="a cat").embedding
    assert len(legacy) == 576


def test_show_reads_the_gguf(client):
    shown = client.show("gemma3")
    assert shown.modelinfo["general.architecture"] == "gemma3"
    assert shown.details.parameter_size.endswith("M")
    assert "completion" in shown.capabilities and "embedding" in shown.capabilities


def test_keep_alive_0_unloads_after_the_answer(server, client):
    client.chat(model="smollm2", messages=HELLO, options=GREEDY)
    assert "smollm2" in {m.model for m in client.ps().models}
    client.chat(model="smollm2", messages=HELLO, options=GREEDY, keep_alive=0)
    deadline = time.monotonic() + 30
    while "smollm2" in {m.model for m in client.ps().models}:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert statuses(server.url)["smollm2"] == "unloaded"
    client.generate(model="smollm2", keep_alive="5m")          # no prompt: loads only
    assert statuses(server.url)["smollm2"] == "loaded"


def test_an_unknown_model_is_a_404_in_ollamas_shape(client):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="llama3.2", messages=HELLO)
    assert (e.value.status_code, e.value.error) == (404, "model 'llama3.2' not found")


def test_pull_says_what_to_do_instead(client):
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("llama3.2")
    assert e.value.status_code == 501 and "--models-dir" in e.value.error


def test_version(server):
    assert httpx.get(server.url + "/api/version").json() == {"version": "0.6.3"}


def test_one_model_server_answers_ollamas_model_endpoints(smollm2_path):
    from server_harness import RunningServer

    from ggserve.server.app import ServerConfig, create_app

    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=512, n_parallel=1))) as s:
        c = ollama.Client(host=s.url, timeout=120)
        name = httpx.get(s.url + "/v1/models").json()["data"][0]["id"]      # the model's general.name
        assert [m.model for m in c.list().models] == [name]
        assert c.show("any").details.family == "llama"
        assert [m.model for m in c.ps().models] == [name]
        assert c.chat(model="any", messages=HELLO, options=GREEDY).message.content == \
            openai_answer(s.url, "any", HELLO)
        with pytest.raises(ollama.ResponseError) as e:
            c.embed(model="any", input="x")
        assert e.value.status_code == 501
