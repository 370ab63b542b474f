"""Hardening II (issue 36): what a request may ask for is checked before any work
(server/api/request_limits.py), a grammar's compile can neither stall the server nor
kill it (server/chat/grammar_worker.py), every route's body goes through the same
checks, and the template variables the server sets are not a request's to set."""
from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from server_harness import RunningServer
from test_hardening import free_port, probe_during, serve, wait_healthy

from ggserve.server.api.media import MediaConfig
from ggserve.server.api.request_limits import RequestLimits, grammar_depth
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.chat.options import RESERVED_TEMPLATE_VARS

LIM = RequestLimits()
MAX_BODY = 2**20


def chained(n: int) -> str:
    """The finding's grammar: root -> r0 -> r1 -> ... -> rn, each rule one level deeper."""
    return "root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} | "0"\n' for i in range(n)) + f'r{n} ::= "0"\n'


def error_of(r: httpx.Response) -> dict:
    body = r.json()
    return body["error"]


def refused(r: httpx.Response, flag: str, status: int = 400) -> dict:
    assert r.status_code == status, r.text[:500]
    err = error_of(r)
    assert flag in err["message"], err
    return err


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    cfg = ServerConfig(model=smollm2_path, n_ctx=512, n_parallel=4, n_batch=256, n_threads=1, metrics=True,
                       embeddings=True, props_endpoint=True, max_body_bytes=MAX_BODY,
                       slot_save_path=str(tmp_path_factory.mktemp("slots")), media=MediaConfig(fetch_enabled=False))
    with RunningServer(create_app(cfg)) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.fixture(scope="module")
def process_server():
    """ggserve serve in its own process, default limits: /health's latency and RSS are its own."""
    port = free_port()
    p = serve("-c", "1024", "-np", "4", port=port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, p)
        httpx.post(url + "/completion", json={"prompt": "Hi", "n_predict": 1, "grammar": 'root ::= "a"'}, timeout=60)
        yield url, p
    finally:
        p.terminate()
        p.wait(timeout=30)


def still_serving(url: str) -> None:
    r = httpx.post(url + "/completion", json={"prompt": "Hi", "n_predict": 2, "grammar": 'root ::= "yes" | "no"'},
                   timeout=60)
    assert r.status_code == 200 and r.json()["content"] in ("yes", "no"), r.text[:300]


# -- the findings, against a server in its own process --------------------------------------------

@pytest.mark.parametrize("path,n", [("/completion", 20_000), ("/completion", 5_000), ("/v1/completions", 20_000),
                                    ("/v1/chat/completions", 5_000), ("/infill", 100_000)])
def test_20000_chained_rules_is_a_quick_400_and_the_server_lives(process_server, path, n):
    url, p = process_server
    body = {"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}], "input_prefix": "a", "input_suffix": "b",
            "max_tokens": 2, "grammar": chained(n)}
    before = rss_mb(p.pid)
    t0 = time.monotonic()
    times, r = probe_during(url, lambda: httpx.post(url + path, json=body, timeout=60))
    elapsed = time.monotonic() - t0 - 0.3          # probe_during's lead-in
    refused(r, "--grammar-max-rules" if n == 5_000 else "--grammar-max-bytes")    # 20,000 rules: 458 kB
    assert elapsed < 3, elapsed
    assert times and max(times) < 0.25, max(times)
    assert rss_mb(p.pid) - before < 100
    assert p.poll() is None
    still_serving(url)


@pytest.mark.parametrize("path,key,n", [("/completion", "n_cmpl", 2_147_483_648), ("/completion", "n_cmpl", 30_000_000),
                                        ("/completion", "n", 2_147_483_648), ("/v1/completions", "n", 2**40),
                                        ("/v1/chat/completions", "n", 30_000_000)])
def test_a_huge_n_is_refused_before_any_copy(process_server, path, key, n):
    url, p = process_server
    body = {"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, key: n}
    before = rss_mb(p.pid)
    times, r = probe_during(url, lambda: httpx.post(url + path, json=body, timeout=60))
    err = refused(r, "--parallel")
    assert err["param"] == key
    assert r.elapsed.total_seconds() < 0.5
    assert max(times) < 0.25 and rss_mb(p.pid) - before < 100
    still_serving(url)


def test_a_grammar_just_under_the_rule_limit_compiles(process_server):
    url, _ = process_server
    grammar = "root ::= " + " | ".join(f"r{i}" for i in range(LIM.grammar_rules - 1)) + "\n" + \
        "".join(f'r{i} ::= "{i}"\n' for i in range(LIM.grammar_rules - 1))
    r = httpx.post(url + "/completion", json={"prompt": "Hi", "n_predict": 1, "grammar": grammar}, timeout=60)
    assert r.status_code == 200, r.text[:300]


# -- the compile worker: a crash and a stall stay in the worker -------------------------------------

@pytest.fixture(scope="module")
def grammars(smollm2_path):
    from ggserve.models.tokenizer.tokenizer import Tokenizer
    from ggserve.server.chat.grammar import Grammars
    g = Grammars(Tokenizer.from_gguf(smollm2_path))
    yield g
    g.close()


def test_a_grammar_that_overflows_the_compilers_stack_is_an_error_not_a_crash(grammars):
    from ggserve.server.chat.grammar import GrammarError
    t0 = time.monotonic()
    with pytest.raises(GrammarError, match="compiler failed"):
        grammars.compile("gbnf", chained(6_000), timeout=30)     # in this process: a segfault
    assert time.monotonic() - t0 < 20
    assert grammars.compile("gbnf", chained(50), timeout=30).source    # a new worker took its place


def test_a_compile_past_its_timeout_is_an_error_and_its_worker_is_replaced(grammars):
    from ggserve.server.chat.grammar import GrammarError
    t0 = time.monotonic()
    with pytest.raises(GrammarError, match="--grammar-timeout"):
        grammars.compile("gbnf", chained(20_000), timeout=1.5)
    assert time.monotonic() - t0 < 4
    pids = [w.proc.pid for w in grammars.pool._all]
    assert all(os.path.exists(f"/proc/{pid}") for pid in pids)  # the killed one is gone from the pool
    assert grammars.compile("json_schema", {"type": "integer"}, timeout=30).source


# -- each limit, on the routes that carry it --------------------------------------------------------

def nested_items(depth: int) -> dict:
    s: dict = {"type": "integer"}
    for _ in range(depth - 1):
        s = {"type": "array", "items": s}
    return s


def props(n: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
OVER = [
    ("/completion", {"prompt": "Hi", "grammar": "root ::= " + '"a" ' * 70_000}, "--grammar-max-bytes"),
    ("/completion", {"prompt": "Hi", "grammar": "".join(f'r{i} ::= "a"\n' for i in range(1001))},
     "--grammar-max-rules"),
    ("/infill", {"input_prefix": "a", "input_suffix": "b", "grammar": "root ::= " + "(" * 65 + '"a"' + ")" * 65},
     "--grammar-max-depth"),
    ("/v1/completions", {"prompt": "Hi", "json_schema": nested_items(LIM.schema_depth + 1)}, "--schema-max-depth"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": props(LIM.schema_breadth + 1)}}}, "--schema-max-breadth"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "enum": [str(i) for i in range(LIM.schema_breadth + 1)]}}}},
     "--schema-max-breadth"),
    ("/completion", {"prompt": "Hi", "json_schema": json.dumps({"type": "string", "pattern": "a" * 1001})},
     "--schema-max-pattern"),
    ("/v1/responses", {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x",
                                                          "schema": nested_items(40)}}}, "--schema-max-depth"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "b" * 2000}}}}}]},
     "--schema-max-pattern"),
    ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}],
                      "tools": [{"name": "f", "input_schema": props(1001)}]}, "--schema-max-breadth"),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL] * 8000}, "--tools-max-bytes"),
    ("/completion", {"prompt": "Hi", "n_probs": LIM.n_probs + 1}, "--max-n-probs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": LIM.n_probs + 1}, "--max-n-probs"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 10**6}, "--max-n-probs"),
    ("/completion", {"prompt": "Hi", "logit_bias": {str(i): 1 for i in range(LIM.logit_bias + 1)}}, "--max-logit-bias"),
    ("/completion", {"prompt": "Hi", "logit_bias": [[i, 1] for i in range(LIM.logit_bias + 1)]}, "--max-logit-bias"),
    ("/v1/chat/completions", {**CHAT, "stop": ["x"] * (LIM.stops + 1)}, "--max-stop"),
    ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}],
                      "stop_sequences": ["x"] * (LIM.stops + 1)}, "--max-stop"),
]


@pytest.mark.parametrize("path,body,flag", OVER, ids=[f"{p}:{f}" for p, _, f in OVER])
def test_over_a_limit_is_a_400_naming_it(client, path, body, flag):
    t0 = time.monotonic()
    refused(client.post(path, json=body), flag)
    assert time.monotonic() - t0 < 2
    assert client.get("/health").status_code == 200


AT = [
    ("/completion", {"prompt": "Hi", "n_predict": 1, "json_schema": nested_items(LIM.schema_depth)}),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 1, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": props(200)}}}),
    ("/completion", {"prompt": "Hi", "n_predict": 1, "n_probs": LIM.n_probs, "stop": ["zz"] * LIM.stops}),
    ("/completion", {"prompt": "Hi", "n_predict": 1, "grammar": "root ::= " + "(" * 60 + '"a"' + ")" * 60}),
    ("/completion", {"prompt": "Hi", "n_predict": 1, "logit_bias": {str(i): -1 for i in range(LIM.logit_bias)}}),
]


@pytest.mark.parametrize("path,body", AT)
def test_at_a_limit_is_served(client, path, body):
    t0 = time.monotonic()
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text[:300]
    assert time.monotonic() - t0 < 10       # (a 32-deep array schema took 2^32 steps before its compile)


def test_grammar_depth_skips_strings_classes_and_comments():
    assert grammar_depth('root ::= ("(" [(] x) # ((((\n') == 1
    assert grammar_depth("start: (a (b /[(]+/))") == 2


# -- reserved template variables --------------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(RESERVED_TEMPLATE_VARS))
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/apply-template", "/v1/messages"])
def test_reserved_template_kwargs_are_400(client, path, key):
    assert {"messages", "tools", "add_generation_prompt"} <= RESERVED_TEMPLATE_VARS
    body = {**CHAT, "model": "m", "chat_template_kwargs": {key: True}}
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text[:300]
    assert key in error_of(r)["message"]


def test_other_template_kwargs_are_passed(client):
    r = client.post("/apply-template", json={**CHAT, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200


# -- every route through the same body checks -------------------------------------------------------

# routes that refuse before they read a body, whatever it holds (and why)
BEFORE_BODY = {"/rerank": 501, "/reranking": 501, "/v1/rerank": 501, "/v1/reranking": 501,   # --reranking off
               "/v1/embeddings": 400,      # SmolLM2's pooling is none: not OpenAI's embeddings
               "/tools": 403, "/cors-proxy": 403,      # --tools / --ui-mcp-proxy off: refused before the body
               "/v1/audio/transcriptions": 400, "/audio/transcriptions": 400}   # multipart: a JSON body has no file


def body_routes(client) -> list[tuple[str, str]]:
    doc = client.get("/openapi.json").json()
    out = [(m.upper(), path) for path, ops in doc["paths"].items() for m in ops if m in ("post", "put", "patch")]
    assert len(out) >= 25 and ("POST", "/v1/streams/lookup") in out
    return out


@pytest.mark.parametrize("kind", ["nesting", "utf8", "size"])
def test_every_route_checks_its_body(client, kind):
    raw = {"nesting": b'{"a":' + b"[" * 1000 + b"]" * 1000 + b"}",
           "utf8": b'{"content": "\xed\xa0\x80"}',
           "size": b'{"content": "' + b"a" * MAX_BODY + b'"}'}[kind]
    status, words = {"nesting": (400, "nesting"), "utf8": (400, "UTF-8"), "size": (413, "--max-body-mb")}[kind]
    for method, path in body_routes(client):
        url = path.replace("{id_slot}", "0") + ("?action=save" if "{id_slot}" in path else "")
        r = client.request(method, url, content=raw, headers={"content-type": "application/json"})
        if path in BEFORE_BODY:
            assert r.status_code == BEFORE_BODY[path], (path, r.text[:200])
            continue
        assert r.status_code == status, (method, path, r.status_code, r.text[:200])
        err = error_of(r)           # Ollama's routes answer {"error": "..."}, as Ollama does
        assert words in (err if isinstance(err, str) else err["message"]), (path, r.text[:200])
    assert client.get("/health").status_code == 200
