"""Router mode (llama-server 11434's): one server over a folder of models, each run by its own
`ggserve serve` child, loaded on first use, the least recently used one giving way.

Two real models (SmolLM2, Gemma 3) and a file that is not a GGUF; answers are checked
against llama-server's greedy tokens (tests/data/completions.json)."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import httpx
import pytest
from router_harness import children, models_dir, router, rss_mib, statuses, wait_status

from ggserve.server.cli.main import serve_parser
from ggserve.server.router.presets import PresetError, flag_table, read_preset

GOLDEN = json.loads((pathlib.Path(__file__).parent / "data" / "completions.json").read_text())["models"]
N = 12


@pytest.fixture(scope="module")
def one_at_a_time(tmp_path_factory, smollm2_path, gemma3_path):
    """A router with --models-max 1 over smollm2, gemma3 and broken."""
    with router(models_dir(tmp_path_factory.mktemp("router"), smollm2_path, gemma3_path), models_max=1) as s:
        yield s


def greedy(url: str, model: str, timeout: float = 180) -> list[int]:
    golden = GOLDEN[model][0]
    r = httpx.post(url + "/completion", timeout=timeout, json={
        "model": model, "prompt": golden["prompt_ids"], "n_predict": N, "temperature": 0,
        "return_tokens": True, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_models_lists_the_folder_unloaded(one_at_a_time):
    assert statuses(one_at_a_time.url) == {"broken": "unloaded", "gemma3": "unloaded", "smollm2": "unloaded"}
    ids = {m["id"] for m in httpx.get(one_at_a_time.url + "/v1/models").json()["data"]}
    assert ids == {"broken", "gemma3", "smollm2"}


def test_models_max_1_alternates_with_llama_cpp_answers_and_frees_the_other(one_at_a_time):
    url, rss = one_at_a_time.url, []
    for model in ["smollm2", "gemma3", "smollm2", "gemma3"]:
        assert greedy(url, model) == GOLDEN[model][0]["generated_ids"][:N]
        other = "gemma3" if model == "smollm2" else "smollm2"
        assert (statuses(url)[model], statuses(url)[other]) == ("loaded", "unloaded")
        kids = children()
        assert len(kids) == 1                     # the evicted model's process is gone
        rss.append(rss_mib(kids[0]))
    # each model's process holds what that model holds, each time it comes back
    assert abs(rss[2] - rss[0]) <= 0.1 * rss[0] and abs(rss[3] - rss[1]) <= 0.1 * rss[1]


def test_a_file_that_fails_to_load_fails_alone_with_its_reason(one_at_a_time):
    url = one_at_a_time.url
    r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": "broken", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 503 and "not a GGUF file" in r.json()["error"]["message"]
    broken = next(m for m in httpx.get(url + "/models").json()["data"] if m["id"] == "broken")
    assert broken["status"]["value"] == "failed" and broken["status"]["failed"] is True
    assert "not a GGUF file" in broken["status"]["reason"]
    assert greedy(url, "smollm2") == GOLDEN["smollm2"][0]["generated_ids"][:N]


@pytest.mark.parametrize("body,message", [
    ({"model": "no-such-model"}, "model 'no-such-model' not found"),
    ({}, "model name is missing from the request")])
def test_a_request_without_a_known_model_is_a_400_in_openai_shape(one_at_a_time, body, message):
    r = httpx.post(one_at_a_time.url + "/v1/chat/completions",
                   json={**body, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == message and r.json()["error"]["type"] == "invalid_request_error"


def test_a_stream_passes_through_as_it_comes(one_at_a_time):
    with httpx.stream("POST", one_at_a_time.url + "/v1/chat/completions", timeout=120, json={
            "model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and len(lines) >= 3


def test_load_and_unload_by_endpoint(one_at_a_time):
    url = one_at_a_time.url
    assert httpx.post(url + "/models/load", json={"model": "gemma3"}).json() == {"success": True}
    wait_status(url, "gemma3", "loaded")
    assert statuses(url)["smollm2"] == "unloaded"
    r = httpx.post(url + "/models/load", json={"model": "gemma3"})
    assert (r.status_code, r.json()["error"]["message"]) == (400, "model is already running")
    assert httpx.post(url + "/models/unload", json={"model": "gemma3"}).json() == {"success": True}
    wait_status(url, "gemma3", "unloaded")
    deadline = time.monotonic() + 60
    while children():                              # its process ends (SIGTERM: it drains first)
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_get_names_its_model_in_the_query(one_at_a_time):
    r = httpx.get(one_at_a_time.url + "/props", params={"model": "smollm2"}, timeout=120)
    assert r.status_code == 200 and r.json()["model_alias"] == "smollm2"
    router_props = httpx.get(one_at_a_time.url + "/props").json()
    assert (router_props["role"], router_props["max_instances"]) == ("router", 1)


# -- presets ---------------------------------------------------------------------------

def test_preset_flags_give_way_to_the_section_then_the_command_line(tmp_path):
    ini = tmp_path / "models.ini"
    ini.write_text("[*]\nctx-size = 1024\ntemp = 0.5\n\n[small]\nmodel = /m/small.gguf\nLLAMA_ARG_CTX_SIZE = 2048\n"
                   "load-on-startup = true\n[plain]\nmodel = /m/plain.gguf\n")
    parser = serve_parser()
    specs, _, _ = read_preset(str(ini), flag_table(parser), str(tmp_path))
    by_id = {s.id: s for s in specs}
    assert by_id["small"].load_on_startup and not by_id["plain"].load_on_startup
    ctx = {mid: parser.parse_args(s.args).ctx_size for mid, s in by_id.items()}
    assert ctx == {"small": 2048, "plain": 1024}
    assert parser.parse_args(by_id["small"].args + ["-c", "512"]).ctx_size == 512   # the command line's flags come last


def test_a_preset_with_an_unknown_key_stops_the_server_naming_it(tmp_path):
    ini = tmp_path / "models.ini"
    ini.write_text("[small]\nmodel = /m/small.gguf\nctx-sise = 1024\n")
    with pytest.raises(PresetError, match="unknown key 'ctx-sise'"):
        read_preset(str(ini), flag_table(serve_parser()), str(tmp_path))
    run = subprocess.run([sys.executable, "-m", "ggserve.server.cli.main", "serve", "--models-preset", str(ini)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "[small] ctx-sise: unknown key 'ctx-sise'" in run.stderr


def test_a_messages_request_for_an_unknown_model_errs_in_anthropics_shape(one_at_a_time):
    r = httpx.post(one_at_a_time.url + "/v1/messages", json={
        "model": "claude-x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": "model 'claude-x' not found"}}


def test_a_crashed_model_fails_alone_and_loads_again(one_at_a_time):
    url = one_at_a_time.url
    assert greedy(url, "smollm2") == GOLDEN["smollm2"][0]["generated_ids"][:N]
    (pid,) = children()
    os.kill(pid, signal.SIGKILL)                   # a native fault would end it the same way
    wait_status(url, "smollm2", "failed")
    model = next(m for m in httpx.get(url + "/models").json()["data"] if m["id"] == "smollm2")
    assert model["status"]["exit_code"] == -signal.SIGKILL and "process ended" in model["status"]["reason"]
    assert greedy(url, "smollm2") == GOLDEN["smollm2"][0]["generated_ids"][:N]   # the next request loads it again


def test_a_folder_model_takes_its_mmproj_and_first_shard(tmp_path):
    from ggserve.server.router.catalog import scan_models_dir

    (tmp_path / "vision").mkdir()
    for name in ("vision/model-Q4_K_M.gguf", "vision/mmproj-model-f16.gguf", "split/big-00001-of-00002.gguf",
                 "split/big-00002-of-00002.gguf", "solo.gguf", "mmproj-solo.gguf", "notes.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"GGUF")
    specs = {s.id: s.args for s in scan_models_dir(str(tmp_path))}
    assert specs == {"vision": ["-m", str(tmp_path / "vision/model-Q4_K_M.gguf"),
                                "--mmproj", str(tmp_path / "vision/mmproj-model-f16.gguf")],
                     "split": ["-m", str(tmp_path / "split/big-00001-of-00002.gguf")],
                     "solo": ["-m", str(tmp_path / "solo.gguf")]}
