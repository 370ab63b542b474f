"""llama-server's sampling flags (--temp, --top-k, --top-p, --min-p, --typical, --repeat-last-n,
--repeat-penalty, --presence-penalty, --frequency-penalty) are every request's defaults, as
llama-server takes them: its answers are in tests/data/sampling_flags (record.py says how)."""
from __future__ import annotations

import json
import os

import httpx
import pytest

from ggserve.server.app import create_app
from ggserve.server.cli.main import config_from_args, serve_parser
from server_harness import RunningServer

REF = json.load(open(os.path.join(os.path.dirname(__file__), "data", "sampling_flags", "reference.json"),
                     encoding="utf-8"))
SETTINGS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_last_n", "repeat_penalty",
            "presence_penalty", "frequency_penalty", "seed")


@pytest.fixture(scope="module")
def server(smollm2_path):
    args = serve_parser().parse_args(["-m", smollm2_path, *REF["flags"], "-c", "512", "-np", "1", "-t", "1"])
    with RunningServer(create_app(config_from_args(args))) as s:
        yield s


def replay(server, case):
    c = REF["cases"][case]
    r = httpx.post(server.url + c["path"], json=c["request"], timeout=120)
    assert r.status_code == c["status"] == 200
    return r.json(), c["response"]


def test_a_request_without_sampling_fields_samples_as_the_flags_say(server):
    got, want = replay(server, "flags_decide")
    assert got["content"] == want["content"]
    assert {k: got["generation_settings"][k] for k in SETTINGS} == \
        pytest.approx({k: want["generation_settings"][k] for k in SETTINGS}, rel=1e-6)


def test_a_chat_request_takes_the_flags_too(server):
    got, want = replay(server, "chat_flags_decide")
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]


def test_a_request_field_wins_over_its_flag(server):
    got, want = replay(server, "request_overrides")
    assert got["content"] == want["content"]
    assert (got["generation_settings"]["top_k"], got["generation_settings"]["temperature"]) == (5, 0.5)


@pytest.mark.parametrize("argv,message", [
    (["--top-p", "2"], "--top-p: top_p must be in (0, 1], got 2.0"),
    (["--temperature", "-1"], "--temp: temperature must be >= 0, got -1.0"),
    (["--mirostat", "2"], "--mirostat 2 is not supported"),
    (["--dry-multiplier", "0.8"], "--dry-multiplier 0.8 is not supported"),
])
def test_a_bad_sampling_flag_stops_the_server_naming_it(smollm2_path, argv, message):
    from ggserve.server.cli.llama_flags import check_llama_flags

    with pytest.raises(SystemExit) as e:
        check_llama_flags(serve_parser().parse_args(["-m", smollm2_path, *argv]))
    assert message in str(e.value)


def test_ignore_eos_flag_is_the_default_of_requests_that_leave_it_out(smollm2_path):
    args = serve_parser().parse_args(["-m", smollm2_path, "--ignore-eos", "-c", "512", "-np", "1", "-t", "1"])
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40, "temperature": 0}
    with RunningServer(create_app(config_from_args(args))) as s:
        flagged = httpx.post(s.url + "/v1/chat/completions", json=chat, timeout=120).json()
        explicit = httpx.post(s.url + "/v1/chat/completions", json={**chat, "ignore_eos": False}, timeout=120).json()
    assert (flagged["choices"][0]["finish_reason"], flagged["usage"]["completion_tokens"]) == ("length", 40)
    assert explicit["choices"][0]["finish_reason"] == "stop" and explicit["usage"]["completion_tokens"] < 40
