"""Server pieces that need no model: stop strings, schemas, errors, and the HTTP
layer + asyncio service on real uvicorn over a scripted fake engine."""
from __future__ import annotations

import json
import threading
import time
import types
from dataclasses import dataclass

import httpx
import pytest
from pydantic import ValidationError
from server_harness import RunningServer, sse_events

from ggserve.server.api import schemas as S
from ggserve.server.api.errors import APIError, to_api_error
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.chat.prompts import PromptBuilder
from ggserve.server.chat.stops import StopMatcher
from ggserve.server.engine.sequence import TokenEvent
from ggserve.server.request_errors import ContextLengthExceeded

# -- stop strings ----------------------------------------------------------------

def run_stops(stops, pieces):
    m = StopMatcher(stops)
    out = [m.push(p) for p in pieces]
    return out, m


def test_stop_within_one_piece():
    out, m = run_stops(["END"], ["abcENDdef"])
    assert out == ["abc"] and m.stopped and m.matched == "END"


def test_stop_split_across_pieces_is_never_leaked():
    out, m = run_stops(["<|stop|>"], ["hello <", "|st", "op", "|> after"])
    assert "".join(out) == "hello " and m.stopped
    assert all("<" not in o for o in out)


def test_partial_stop_released_when_it_diverges():
    out, m = run_stops(["STOP"], ["ab S", "T", "x more"])
    assert out == ["ab ", "", "STx more"] and not m.stopped
    assert m.flush() == ""


def test_partial_stop_held_then_flushed_at_end():
    out, m = run_stops(["world"], ["hello wor"])
    assert out == ["hello "] and m.flush() == "wor"


def test_earliest_of_several_stops_wins():
    out, m = run_stops(["bb", "a"], ["xxbba"])
    assert out == ["xx"] and m.matched == "bb"


def test_no_stops_passes_through():
    out, m = run_stops(None, ["a", "b"])
    assert out == ["a", "b"] and m.flush() == ""


def test_nothing_after_stop():
    m = StopMatcher(["x"])
    assert m.push("axb") == "a"
    assert m.push("more") == "" and m.flush() == ""


# -- schemas ---------------------------------------------------------------------------

def chat_body(**kw):
    return {"messages": [{"role": "user", "content": "hi"}], **kw}


def test_unknown_fields_are_ignored():
    r = S.ChatCompletionRequest.model_validate(chat_body(frobnicate=3, parallel_tool_calls=True))
    assert r.messages[0].content == "hi"


@pytest.mark.parametrize("bad", [
    {"temperature": "hot"}, {"temperature": 3.0}, {"top_p": 1.5}, {"n": 0},
    {"max_tokens": "10"}, {"max_tokens": 0}, {"stream": 1}, {"top_logprobs": 21},
    {"logit_bias": {"abc": 1}}, {"logit_bias": {"5": 200}}, {"presence_penalty": -3},
    {"messages": []}, {"messages": [{"role": "wizard", "content": "x"}]},
    {"messages": [{"content": "x"}]}, {"stop": 5},
])
def test_bad_values_fail_validation(bad):
    with pytest.raises(ValidationError) as e:
        S.ChatCompletionRequest.model_validate(chat_body(**bad))
    err = to_api_error(e.value)
    assert err.status == 400 and err.type == "invalid_request_error"


def test_validation_error_names_param():
    with pytest.raises(ValidationError) as e:
        S.ChatCompletionRequest.model_validate(chat_body(temperature=9))
    assert to_api_error(e.value).param == "temperature"


def test_stop_string_becomes_list_and_ints_accepted_for_floats():
    r = S.ChatCompletionRequest.model_validate(chat_body(stop="x", temperature=1))
    assert r.stop == ["x"] and r.temperature == 1.0


def test_completion_prompt_shapes():
    for p in ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]]:
        S.CompletionRequest.model_validate({"prompt": p})
    with pytest.raises(ValidationError):
        S.CompletionRequest.model_validate({"prompt": []})
    with pytest.raises(ValidationError):
        S.CompletionRequest.model_validate({})


def test_error_shape():
    body = APIError(429, "busy", code="queue_full").body()
    assert body == {"error": {"message": "busy", "type": "rate_limit_error",
                              "param": None, "code": "queue_full"}}


def test_completion_logprobs_shape():
    lp = S.completion_logprobs([(b"He", -0.5, [(b"He", -0.5), (b"A", -1.0)]),
                                (b"llo", -0.1, [(b"llo", -0.1)])])
    assert lp == {"tokens": ["He", "llo"], "token_logprobs": [-0.5, -0.1],
                  "top_logprobs": [{"He": -0.5, "A": -1.0}, {"llo": -0.1}],
                  "text_offset": [0, 2]}


# -- fake engine ---------------------------------------------------------------------

REPLY = "Hello, wörld! <|x|> done."   # multi-byte char: tokens are bytes


@dataclass
class FakeRequest:
    id: str
    prompt: list
    params: object
    max_tokens: int
    ignore_eos: bool = False
    id_slot: int = -1


class FakeTokenizer:
    n_vocab, bos_id, eos_id = 258, 256, 257
    eog_ids = frozenset({257})

    def encode(self, text, add_special=True, parse_special=False):
        return ([self.bos_id] if add_special else []) + list(text.encode())

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", "replace")

    def token_bytes(self, i, special=True):
        return bytes([i]) if i < 256 else (b"<s>" if i == 256 else b"</s>")

    def is_eog(self, i):
        return i == self.eos_id


class FakeDecoder:
    def __init__(self, tok):
        self.buf = b""

    def push(self, t):
        if t >= 256:
            return ""
        self.buf += bytes([t])
        for cut in range(len(self.buf), -1, -1):
            try:
                text = self.buf[:cut].decode()
            except UnicodeDecodeError:
                continue
            self.buf = self.buf[cut:]
            return text

    def flush(self):
        text, self.buf = self.buf.decode("utf-8", "replace"), b""
        return text


class FakeTemplate:
    def render(self, messages, add_generation_prompt=True, tools=None, image_marker=None):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class FakeEngine:
    """Replies REPLY (as bytes) to every prompt, one token per step."""

    def __init__(self, n_ctx=512, n_parallel=4, step_s=0.003):
        self.tokenizer = FakeTokenizer()
        self.chat_template = FakeTemplate()
        self.model_name = "fake"
        self.loaded = types.SimpleNamespace(adapters=types.SimpleNamespace(loras=[], scales=[]))   # no LoRA
        self.n_ctx, self.n_parallel, self.step_s = n_ctx, n_parallel, step_s
        self.n_ctx_train, self.kv_size = 2048, n_ctx * n_parallel
        self.waiting, self.running = [], {}
        self.reply = list(REPLY.encode()) + [257]
        self.lock = threading.Lock()   # catches two threads in the engine at once
        self.closed = False
        self.vision = None

    def _guard(self):
        assert self.lock.acquire(blocking=False), "engine called concurrently"

    def add(self, req):
        self._guard()
        try:
            if len(req.prompt) + 1 > self.n_ctx:
                raise ContextLengthExceeded(f"prompt of {len(req.prompt)} tokens "
                                            f"exceeds {self.n_ctx}")
            req.params.validate()
            self.waiting.append(req)
        finally:
            self.lock.release()

    def cancel(self, rid):
        self._guard()
        self.waiting = [r for r in self.waiting if r.id != rid]
        self.running.pop(rid, None)
        self.lock.release()

    def has_work(self):
        return bool(self.waiting or self.running)

    def step(self):
        self._guard()
        try:
            time.sleep(self.step_s)
            while self.waiting and len(self.running) < self.n_parallel:
                r = self.waiting.pop(0)
                self.running[r.id] = [r, 0]
            events = []
            for rid, st in list(self.running.items()):
                r, i = st
                tok = self.reply[i % len(self.reply)] if r.ignore_eos else self.reply[i]
                if r.ignore_eos and tok == 257:
                    tok = ord(" ")
                st[1] = i + 1
                finish = None
                if tok == 257:
                    finish = "stop"
                elif st[1] >= r.max_tokens:
                    finish = "length"
                top = [(tok, -0.25), (ord("?"), -2.0)][: r.params.n_probs]
                if st[1] == 3 and bytes(t for t in r.prompt if t < 256).find(b"BREAK") >= 0:
                    # as the engine ends one request (an image that failed to encode)
                    events.append(TokenEvent(rid, None, None, [], "error", len(r.prompt), 0, "tile failed"))
                    del self.running[rid]
                    continue
                events.append(TokenEvent(rid, tok, -0.25, top, finish, len(r.prompt), 0))
                if finish:
                    del self.running[rid]
            return events
        finally:
            self.lock.release()

    def stats(self):
        used = sum(len(r.prompt) + i for r, i in self.running.values())
        return {"kv_used": used, "kv_total": self.n_ctx * self.n_parallel,
                "running": len(self.running), "waiting": len(self.waiting)}

    def close(self):
        self.closed = True


def fake_app(engine=None, loader=None, **cfg):
    engine = engine or FakeEngine(n_parallel=cfg.get("n_parallel", 4))
    cfg = ServerConfig(model="/models/fake.gguf", metrics=True, **cfg)
    return create_app(cfg, engine_loader=loader or (lambda: engine),
                      make_request=FakeRequest, make_decoder=FakeDecoder,
                      make_prompts=lambda e: PromptBuilder(e.tokenizer, e.chat_template)), engine


@pytest.fixture(scope="module")
def fake():
    app, engine = fake_app(n_parallel=4, max_queue=4)
    with RunningServer(app) as srv:
        srv.engine = engine
        yield srv


def chat(srv, **kw):
    return httpx.post(srv.url + "/v1/chat/completions", json=chat_body(**kw), timeout=30)


def test_fake_chat_non_stream(fake):
    r = chat(fake)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": REPLY}
    assert body["choices"][0]["finish_reason"] == "stop"
    n_prompt = len(FakeTokenizer().encode("<user>hi<assistant>"))
    assert body["usage"]["prompt_tokens"] == n_prompt
    assert body["usage"]["completion_tokens"] == len(REPLY.encode()) + 1
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_fake_stream_framing_and_usage(fake):
    r = httpx.post(fake.url + "/v1/chat/completions", timeout=30, json=chat_body(
        stream=True, stream_options={"include_usage": True}))
    assert r.headers["content-type"].startswith("text/event-stream")
    ev = sse_events(r)
    assert ev[-1] == "[DONE]"
    chunks = ev[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all("usage" in c for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert text == REPLY
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_fake_stop_split_across_tokens(fake):
    # every token is one byte, so "<|x|>" spans five tokens
    for stream in (False, True):
        r = httpx.post(fake.url + "/v1/chat/completions", timeout=30, json=chat_body(
            stop=["<|x|>"], stream=stream))
        if stream:
            chunks = sse_events(r)[:-1]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            finish = chunks[-1]["choices"][0]["finish_reason"]
        else:
            text = r.json()["choices"][0]["message"]["content"]
            finish = r.json()["choices"][0]["finish_reason"]
        assert text == "Hello, wörld! " and finish == "stop"
    time.sleep(0.1)
    assert fake.metric("ggserve_kv_cells_used") == 0   # stopped sequences were cancelled


def test_fake_logprobs_follow_released_text(fake):
    r = chat(fake, logprobs=True, top_logprobs=2, stop=["<|x|>"])
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert b"".join(bytes(e["bytes"]) for e in content).decode() == "Hello, wörld! "
    assert content[0]["top_logprobs"][1] == {"token": "?", "logprob": -2.0, "bytes": [63]}


def test_fake_n2_and_length(fake):
    r = chat(fake, n=2, max_tokens=5)
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert all(c["message"]["content"] == "Hello" and c["finish_reason"] == "length"
               for c in choices)
    assert r.json()["usage"]["completion_tokens"] == 10


def test_fake_completions_legacy_logprobs(fake):
    r = httpx.post(fake.url + "/v1/completions", timeout=30, json={
        "prompt": "x", "max_tokens": 3, "logprobs": 1})
    c = r.json()["choices"][0]
    assert c["text"] == "Hel" and c["logprobs"]["tokens"] == ["H", "e", "l"]
    assert c["logprobs"]["text_offset"] == [0, 1, 2]
    assert c["logprobs"]["top_logprobs"][0] == {"H": -0.25}


def test_fake_disconnect_frees_kv(fake):
    with httpx.stream("POST", fake.url + "/v1/chat/completions", timeout=30,
                      json=chat_body(stream=True, ignore_eos=True, max_tokens=100000)) as r:
        lines = r.iter_lines()   # breaking out of it would close the connection
        while '"content":"H' not in next(lines):
            pass
        assert fake.metric("ggserve_kv_cells_used") > 0
    deadline = time.monotonic() + 1.0
    while fake.metric("ggserve_kv_cells_used") > 0:
        assert time.monotonic() < deadline, "KV cells not freed within 1 s"
        time.sleep(0.02)
    assert chat(fake).status_code == 200


@pytest.mark.parametrize("body,status,code", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"messages": []}).encode(), 400, None),
    (json.dumps({"id_slot": 4, **chat_body()}).encode(), 400, None),     # 4 slots: 0..3, or -1
    (json.dumps(chat_body(n=5)).encode(), 400, None),
    (json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]}).encode(), 400, None),
    (json.dumps({"messages": [{"role": "user", "content": "x" * 600}]}).encode(), 400,
     "context_length_exceeded"),
])
def test_fake_errors(fake, body, status, code):
    r = httpx.post(fake.url + "/v1/chat/completions", content=body, timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] == code or code is None
    assert chat(fake).status_code == 200


def test_fake_queue_full_429(fake):
    import concurrent.futures as cf
    body = chat_body(ignore_eos=True, max_tokens=400)
    with cf.ThreadPoolExecutor(12) as pool:
        futs = [pool.submit(httpx.post, fake.url + "/v1/chat/completions", json=body,
                            timeout=60) for _ in range(12)]
        codes = sorted(f.result().status_code for f in futs)
    assert codes.count(200) == 8 and codes.count(429) == 4   # 4 running + 4 queued
    rejected = [f.result() for f in futs if f.result().status_code == 429][0]
    assert rejected.headers["retry-after"] == "1"
    assert rejected.json()["error"]["type"] == "rate_limit_error"


def test_fake_health_503_while_loading_then_ok():
    gate = threading.Event()
    engine = FakeEngine()

    def slow_load():
        gate.wait(10)
        return engine

    app, _ = fake_app(engine, loader=slow_load)
    srv = RunningServer(app)
    srv._thread.start()
    try:
        for _ in range(100):
            try:
                r = httpx.get(srv.url + "/health")
                break
            except httpx.TransportError:
                time.sleep(0.05)
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
        assert chat(srv).status_code == 503
        gate.set()
        for _ in range(100):
            if httpx.get(srv.url + "/health").status_code == 200:
                break
            time.sleep(0.05)
        assert chat(srv).status_code == 200
    finally:
        gate.set()
        srv.__exit__()
    assert engine.closed


def test_fake_api_key():
    app, _ = fake_app(api_keys=["sekrit"])
    with RunningServer(app) as srv:
        assert chat(srv).status_code == 401
        r = httpx.post(srv.url + "/v1/chat/completions", json=chat_body(),
                       headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(srv.url + "/v1/chat/completions", json=chat_body(),
                       headers={"Authorization": "Bearer sekrit"})
        assert r.status_code == 200
        assert httpx.get(srv.url + "/health").status_code == 200
        assert httpx.get(srv.url + "/v1/models").status_code == 200


# -- CLI ----------------------------------------------------------------------------------

def test_cli_flags_and_env(monkeypatch, tmp_path):
    from ggserve.server.cli import main as cli

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "2048")
    monkeypatch.setenv("LLAMA_ARG_N_PARALLEL", "3")
    monkeypatch.setenv("LLAMA_ARG_ENDPOINT_METRICS", "1")
    monkeypatch.setenv("LLAMA_API_KEY", "a,b")
    args = cli.serve_parser().parse_args(["-m", str(model), "-np", "6", "-ngl", "99",
                                          "-b", "128", "-t", "2", "-a", "smol"])
    cfg = cli.config_from_args(args)
    assert (cfg.n_ctx, cfg.n_parallel, cfg.n_gpu_layers, cfg.n_batch, cfg.n_threads) == \
        (2048, 6, 99, 128, 2)      # the flag wins over the environment
    assert cfg.metrics and cfg.api_keys == ["a", "b"] and cfg.alias == "smol"
    args = cli.serve_parser().parse_args(["-m", str(model), "--n-gpu-layers", "5",
                                          "--ctx-size", "64", "--parallel", "2"])
    assert (args.n_gpu_layers, args.ctx_size, args.parallel) == (5, 64, 2)


def test_cli_default_model_and_help(capsys):
    from ggserve.server.cli import main as cli

    assert cli.default_model() is None or cli.default_model().endswith(".gguf")
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--ctx-size", "-np", "--batch-size", "--n-gpu-layers",
                 "--threads", "--host", "--port", "--api-key", "--alias",
                 "--chat-template-file", "--metrics", "--mmproj", "LLAMA_ARG_CTX_SIZE"):
        assert flag in out
    assert cli.main(["bogus"]) == 2


def test_a_request_the_engine_ends_gets_an_error_and_others_go_on(fake):
    import concurrent.futures as cf
    with cf.ThreadPoolExecutor(2) as pool:
        ok = pool.submit(chat, fake, ignore_eos=True, max_tokens=40)
        broken = chat(fake, messages=[{"role": "user", "content": "BREAK"}])
        assert ok.result().status_code == 200
    assert broken.status_code == 500
    assert broken.json()["error"]["message"] == "tile failed"
    assert fake.engine.stats()["running"] == 0


def test_a_stream_the_engine_ends_carries_an_error_event(fake):
    with httpx.stream("POST", fake.url + "/v1/chat/completions", timeout=30,
                      json=chat_body(stream=True, messages=[{"role": "user", "content": "BREAK"}])) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert r.status_code == 200
    assert json.loads(lines[-2][6:])["error"]["message"] == "tile failed"
    assert lines[-1] == "data: [DONE]"          # the stream ended, not cut (issue 21)
    assert chat(fake).status_code == 200
