"""/rerank with --reranking against llama-server 11434's answers for the same models and
requests (tests/data/rerank, how they were made in make_reference.py): the same order,
scores within 1e-3 (relative to the score's size), the same token counts, the same refusals.
Reranking runs through the scheduler like any embedding, so it batches with chats.
"""
from __future__ import annotations

import json
import pathlib

import httpx
import pytest

from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer

REF = json.loads((pathlib.Path(__file__).parent / "data" / "rerank" / "reference.json").read_text())


def reranker(model_path: str, **kw) -> RunningServer:
    # what `ggserve serve --reranking` sets: embeddings on, pooling rank
    cfg = ServerConfig(model=model_path, n_ctx=4096, n_parallel=kw.pop("n_parallel", 2), n_threads=2,
                       embeddings=True, pooling="rank", **kw)
    return RunningServer(create_app(cfg))


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model_server(request, smollm2_path, gemma3_path):
    path = {"smollm2": smollm2_path, "gemma3": gemma3_path}[request.param]
    with reranker(path) as srv:
        yield request.param, srv


def post(srv, body, path="/rerank") -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=300)


def results(answer):
    return answer if isinstance(answer, list) else answer["results"]


def score(item) -> float:
    return item["score"] if "score" in item else item["relevance_score"]


def assert_same_ranking(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert abs(score(g) - score(w)) <= 1e-3 * max(1.0, abs(score(w))), (g, w)
        assert g.keys() == w.keys()
        assert g.get("text") == w.get("text")
    # the order is llama-server's wherever two scores are not a near tie
    want_scores = [score(w) for w in want]
    for i in range(len(want) - 1):
        if want_scores[i] - want_scores[i + 1] > 2e-3 * max(1.0, abs(want_scores[i])):
            assert got[i]["index"] == want[i]["index"]


@pytest.mark.parametrize("case", ["jina", "jina_top_n", "tei_return_text", "one_document"])
def test_scores_equal_llama_server(model_server, case):
    name, srv = model_server
    ref = REF["models"][name]["cases"][case]
    r = post(srv, ref["request"])
    assert r.status_code == 200, r.text
    assert_same_ranking(results(r.json()), results(ref["answer"]))
    if isinstance(ref["answer"], dict):
        assert r.json()["usage"] == ref["answer"]["usage"]
        assert r.json()["object"] == "list"


@pytest.mark.parametrize("case", ["error_no_query", "error_query_not_string", "error_empty_documents",
                                  "error_documents_not_strings"])
def test_bad_requests_refused_as_llama_server(model_server, case):
    name, srv = model_server
    ref = REF["models"][name]["cases"][case]
    r = post(srv, ref["request"])
    assert r.status_code == ref["status"] == 400
    assert r.json()["error"]["message"] == ref["answer"]["error"]["message"]
    assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/reranking", "/v1/rerank", "/v1/reranking"])
def test_aliases_answer_as_rerank(model_server, path):
    name, srv = model_server
    ref = REF["models"][name]["cases"]["one_document"]
    r = post(srv, ref["request"], path)
    assert r.status_code == 200
    assert_same_ranking(r.json()["results"], ref["answer"]["results"])


def test_rerank_batches_with_a_streaming_chat(smollm2_path):
    """A rerank request while a chat streams: the chat's answer is the one it gives alone."""
    chat = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24,
            "temperature": 0}
    ref = REF["models"]["smollm2"]["cases"]["jina"]
    with reranker(smollm2_path) as srv:
        alone = httpx.post(srv.url + "/v1/chat/completions", json=chat, timeout=300).json()
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json={**chat, "stream": True},
                          timeout=300) as stream:
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            ranked = post(srv, ref["request"])        # while the chat is still generating
            rest = [line for line in lines if line.startswith("data: ")]
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                   for line in [first] + rest if line != "data: [DONE]" and json.loads(line[6:])["choices"])
    assert text == alone["choices"][0]["message"]["content"]
    assert_same_ranking(ranked.json()["results"], ref["answer"]["results"])


def test_without_reranking_is_not_supported(smollm2_path):
    ref = REF["not_enabled"]
    cfg = ServerConfig(model=smollm2_path, n_ctx=512, n_parallel=1, n_threads=2, embeddings=True)
    with RunningServer(create_app(cfg)) as srv:
        r = post(srv, REF["models"]["smollm2"]["cases"]["jina"]["request"])
    assert r.status_code == ref["status"] == 501
    assert r.json()["error"]["message"] == ref["answer"]["error"]["message"]
    assert r.json()["error"]["type"] == ref["answer"]["error"]["type"] == "not_supported_error"
