"""llama-server's command line and response details that llama.cpp's own server test suite
(scripts/llama_server_suite.py) relies on."""
from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import httpx
import pytest

from ggserve.server.app import ServerConfig, create_app
from ggserve.server.cli.main import config_from_args, serve_parser
from ggserve.server.cli.llama_flags import llama_argv
from server_harness import RunningServer

# What tools/server/tests/utils.py (llama.cpp 11434) passes to every server it starts.
SUITE_ARGV = ["--port", "8080", "--temp", "0.8", "--seed", "42", "--host", "127.0.0.1", "--offline",
              "--ctx-size", "512", "--parallel", "2", "--n-predict", "64", "--batch-size", "32",
              "--ubatch-size", "32", "-fa", "on", "--cont-batching", "--no-slots", "--no-jinja", "--no-ui"]


def test_suite_argv_parses_into_request_defaults(smollm2_path):
    cfg = config_from_args(serve_parser().parse_args(["-m", smollm2_path, *SUITE_ARGV]))
    assert cfg.sampling_defaults == {"temperature": 0.8, "seed": 42}
    assert cfg.n_predict == 64
    assert cfg.webui is False and cfg.slots_endpoint is False


@pytest.mark.parametrize("flag", ["--cache-idle-slots", "--no-cache-idle-slots"])
def test_flags_that_change_nothing_here_are_accepted(smollm2_path, flag):
    # llama-server's --[no-]cache-idle-slots: ggserve moves an idle slot's prompt to host RAM only when
    # its cells are needed, so there is nothing to switch (the help says so)
    cfg = config_from_args(serve_parser().parse_args(["-m", smollm2_path, flag]))
    assert cfg == config_from_args(serve_parser().parse_args(["-m", smollm2_path]))


def test_seed_minus_one_is_random_and_no_ui_default_keeps_webui(smollm2_path):
    cfg = config_from_args(serve_parser().parse_args(["-m", smollm2_path, "--seed", "-1"]))
    assert cfg.sampling_defaults == {} and cfg.n_predict == -1 and cfg.webui is True


def test_bad_n_predict_names_the_flag(smollm2_path, capsys):
    with pytest.raises(SystemExit) as e:
        config_from_args(serve_parser().parse_args(["-m", smollm2_path, "-n", "-2"]))
    assert "--n-predict" in str(e.value.code)


@pytest.fixture(scope="module")
def server(smollm2_path):
    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=512, n_parallel=1,
                                               n_predict=5, sampling_defaults={"temperature": 0.8, "seed": 42}))) as s:
        yield s


CHAT = {"messages": [{"role": "user", "content": "Tell me a long story about a cat."}]}


def test_n_predict_is_the_default_limit(server):
    r = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=120).json()
    assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["finish_reason"] == "length"
    r = httpx.post(server.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 7}, timeout=120).json()
    assert r["usage"]["completion_tokens"] == 7


def test_seed_default_makes_sampled_answers_repeat(server):
    a, b, c = (httpx.post(server.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 12, **extra},
                          timeout=120).json()["choices"][0]["message"]["content"]
               for extra in ({}, {}, {"seed": 42}))
    assert a == b == c


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6")
def test_host_lists_several_addresses(smollm2_path):
    port = _free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "ggserve")
    p = subprocess.Popen([exe, "serve", "-m", smollm2_path, "--port", str(port), "--host", "127.0.0.1,::1",
                          "-c", "256", "-np", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, seen = time.monotonic() + 120, set()
        while time.monotonic() < deadline and len(seen) < 2 and p.poll() is None:
            for host in ("127.0.0.1", "[::1]"):
                try:
                    if httpx.get(f"http://{host}:{port}/health", timeout=2).status_code == 200:
                        seen.add(host)
                except httpx.TransportError:
                    pass
            time.sleep(0.2)
        assert seen == {"127.0.0.1", "[::1]"}
    finally:
        p.terminate()
        p.wait(timeout=30)


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}


def test_cors_default_echoes_any_origin_before_auth(smollm2_path):
    # llama-server 11434 with its default --cors-origins '*' and an API key set
    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=256, n_parallel=1,
                                               api_keys=["k"]))) as s:
        r = httpx.options(s.url + "/completions", headers={"Origin": "web.mydomain.fr", **PREFLIGHT})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "web.mydomain.fr"
        assert r.headers["access-control-allow-credentials"] == "true"
        assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        assert r.headers["access-control-allow-headers"] == "*"
        r = httpx.get(s.url + "/health", headers={"Origin": "localhost"})
        assert r.headers["access-control-allow-origin"] == "localhost"


@pytest.mark.parametrize("origin,echoed", [
    ("http://localhost", True), ("http://localhost:8080", True), ("http://127.0.0.1:3000", True),
    ("http://[::1]", True), ("http://[::1]:3000", True), ("http://evil.com", False),
    ("http://localhost.evil.com", False), ("http://notlocalhost", False)])
def test_cors_localhost_reflects_only_local_origins(origin, echoed):
    from ggserve.server.api.cors import CORS

    assert (CORS(None, ["localhost"]).allowed(origin) == origin) is echoed


def test_cors_localhost_on_a_server(smollm2_path):
    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=256, n_parallel=1,
                                               cors_origins=["localhost"]))) as s:
        r = httpx.options(s.url + "/completions", headers={"Origin": "http://[::1]:3000", **PREFLIGHT})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://[::1]:3000"
        r = httpx.options(s.url + "/completions", headers={"Origin": "http://evil.com", **PREFLIGHT})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_aliases_and_tags_in_models(smollm2_path):
    # llama-server 11434: -a is a comma-separated set of aliases, the id is its first in sorted order
    cfg = config_from_args(serve_parser().parse_args(["-m", smollm2_path, "-c", "256", "-np", "1",
                                                      "--alias", "tinyllama-2,fim,code", "--tags", "chat,fim,small"]))
    with RunningServer(create_app(cfg)) as s:
        m = httpx.get(s.url + "/models").json()["data"][0]
        assert (m["id"], m["aliases"], m["tags"]) == ("code", ["code", "fim", "tinyllama-2"], ["chat", "fim", "small"])
        r = httpx.post(s.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 1}).json()
        assert r["model"] == "code"


def test_system_fingerprint_names_the_build(server):
    # llama.cpp's suite checks that it starts with "b" (llama-server: b<build>-<commit>)
    r = httpx.post(server.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 1}, timeout=120).json()
    assert r["system_fingerprint"] == "b11434-ggserve"


def test_props_show_the_command_line_defaults(server):
    # llama-server 11434 started with --seed 42 -n 5 shows them in /props
    params = httpx.get(server.url + "/props").json()["default_generation_settings"]["params"]
    assert (params["seed"], params["n_predict"], params["temperature"]) == (42, 5, 0.8)


def test_first_streamed_chunk_is_the_role_with_null_content(server):
    # llama-server 11434's first chunk: {"role": "assistant", "content": null}; later ones no role
    from server_harness import sse_events

    ev = sse_events(httpx.post(server.url + "/v1/chat/completions", timeout=120,
                               json={**CHAT, "max_tokens": 3, "stream": True}))
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all("role" not in e["choices"][0]["delta"] for e in ev[1:-1] if e["choices"])


# llama-server 11434 on SmolLM2 (POST /apply-template; errors from /v1/chat/completions), recorded by hand
SMOL_SYS = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
HI = {"role": "user", "content": "Hi"}


@pytest.mark.parametrize("body,prompt", [
    ({"messages": [HI], "add_generation_prompt": False}, SMOL_SYS + "<|im_start|>user\nHi<|im_end|>\n"),
    ({"messages": [HI, {"role": "assistant", "content": "Hello"}], "add_generation_prompt": False,
      "continue_final_message": True}, SMOL_SYS + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello"),
])
def test_add_generation_prompt_and_continue_final_message(server, body, prompt):
    assert httpx.post(server.url + "/apply-template", json=body, timeout=60).json()["prompt"] == prompt


@pytest.mark.parametrize("body,message", [
    ({"messages": [HI, {"role": "assistant", "content": "Hello"}], "add_generation_prompt": True,
      "continue_final_message": True}, "Cannot set both add_generation_prompt and continue_final_message to true."),
    ({"messages": [HI, {"role": "assistant", "content": "A"}, {"role": "assistant", "content": "B"}]},
     "Cannot have 2 or more assistant messages at the end of the list."),
])
def test_continuation_errors_as_llama_server(server, body, message):
    for path in ("/apply-template", "/v1/chat/completions"):
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 400
        assert (r.json()["error"]["message"], r.json()["error"]["type"]) == (message, "invalid_request_error")


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "Once"})])
def test_usage_chunk_carries_timings(server, path, body):
    # llama-server 11434 adds its timings to the final usage chunk (llama.cpp's suite checks it)
    from server_harness import sse_events

    ev = sse_events(httpx.post(server.url + path, timeout=120, json={
        **body, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}))
    last = ev[-2]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3
    assert last["timings"]["predicted_n"] == 3 and "prompt_per_second" in last["timings"]


def test_verbose_request_field(server):
    # llama-server 11434: "verbose": true adds __verbose (the answer in its native shape, with the prompt)
    body = {"messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}],
            "max_tokens": 2}
    r = httpx.post(server.url + "/chat/completions", json={**body, "verbose": True}, timeout=60).json()
    v = r["__verbose"]
    assert v["prompt"].endswith("<|im_start|>user\nWhat is the best book<|im_end|>\n<|im_start|>assistant\n")
    assert "Book" in v["prompt"] and v["content"] == r["choices"][0]["message"]["content"]
    assert v["tokens_predicted"] == 2
    assert "__verbose" not in httpx.post(server.url + "/chat/completions", json=body, timeout=60).json()


def test_underscores_in_long_flags_read_as_dashes(smollm2_path):
    # llama.cpp's suite passes --backend_sampling; llama.cpp's arg parser reads _ as -
    from ggserve.server.cli.llama_flags import llama_argv

    argv = llama_argv(["-m", smollm2_path, "--backend_sampling", "--n_predict=7", "--alias", "a_b"])
    assert argv[2:] == ["--backend-sampling", "--n-predict=7", "--alias", "a_b"]
    cfg = config_from_args(serve_parser().parse_args(argv))
    assert cfg.n_predict == 7 and cfg.alias == "a_b"


@pytest.mark.parametrize("value,kwargs", [("off", {"enable_thinking": False}), ("on", {"enable_thinking": True}),
                                          ("auto", {})])
def test_reasoning_flag_sets_enable_thinking(smollm2_path, value, kwargs):
    # llama-server 11434's --reasoning on|off|auto (common/arg.cpp): the default template kwargs
    cfg = config_from_args(serve_parser().parse_args(["-m", smollm2_path, "--reasoning", value]))
    assert cfg.chat_template_kwargs == kwargs


@pytest.mark.parametrize("argv,name", [(["--media-path", "x"], "--media-path"), (["--grp-attn-n", "4"], "--grp-attn-n")])
def test_unsupported_llama_flags_are_refused_by_name(argv, name, capsys):
    with pytest.raises(SystemExit):
        serve_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert f"error: {name} is not supported" in err


def test_cors_header_names_keep_llama_servers_capitals(smollm2_path):
    # llama.cpp's suite reads headers into a plain dict: "Access-Control-Allow-Origin" as llama-server writes it
    import requests

    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=256, n_parallel=1))) as s:
        h = dict(requests.options(s.url + "/completions", headers={"Origin": "x.fr", **PREFLIGHT}).headers)
        assert (h["Access-Control-Allow-Origin"], h["Access-Control-Allow-Credentials"]) == ("x.fr", "true")


LLAMA_FLAGS = json.loads((pathlib.Path(__file__).parent / "data" / "llama_flags" / "llama_server_help.json").read_text())
# flags that print and exit on llama-server too
_INFO = {"-h", "--help", "--usage", "--version", "--license", "--completion-bash", "--list-devices", "--cache-list"}


@pytest.mark.parametrize("flag,takes_value", [f for f in LLAMA_FLAGS["flags"] if f[0] not in _INFO])
def test_every_llama_server_flag_works_or_is_refused_by_its_name(flag, takes_value, capsys):
    """llama-server 11434's --help: each flag either parses, or the error names that flag (never
    another one: `-cl` is not `-c l`, `-mmdev` not `-m mdev`)."""
    try:
        serve_parser().parse_args(llama_argv([flag] + (["1"] if takes_value else [])))
    except SystemExit:
        assert flag in capsys.readouterr().err.strip().splitlines()[-1]
