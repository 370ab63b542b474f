"""llama-server's native endpoints (/completion, /completions, /infill, /props) compared field
by field with llama-server 11434's answers on the same models (tests/data/native_api: how
they were made). The differences kept on purpose are in docs/server.md ("llama-server's
native endpoints")."""
import json
import pathlib
import time

import httpx
import pytest

from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer, sse_events
from synth_golden import SYNTH

REF = json.loads((pathlib.Path(__file__).parent / "data" / "native_api" / "reference.json").read_text())
# Values that depend on the machine and the moment, compared by presence only.
VOLATILE = {"timings", "model"}
SETTINGS_OURS = {"reasoning_format"}      # the server's own flag's value (llama-server: its default)


def case(model: str, name: str) -> dict:
    return REF["models"][model]["cases"][name]


@pytest.fixture(scope="module")
def smol(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=2048, n_parallel=1, n_threads=2, n_batch=2048, metrics=True)
    with RunningServer(create_app(cfg)) as srv:
        yield srv


@pytest.fixture(scope="module")
def qwen():
    cfg = ServerConfig(model=str(SYNTH / "models" / "synth-qwen3-q8_0.gguf"), n_ctx=4096, n_parallel=1,
                       n_threads=2, n_batch=2048)
    with RunningServer(create_app(cfg)) as srv:
        yield srv


def assert_same_answer(got: dict, want: dict):
    assert set(got) == set(want), (set(got) ^ set(want))
    for k, v in want.items():
        if k in VOLATILE:
            continue
        if k == "generation_settings":
            assert set(got[k]) == set(v), set(got[k]) ^ set(v)
            for sk, sv in v.items():
                if sk not in SETTINGS_OURS:
                    assert got[k][sk] == (pytest.approx(sv, rel=1e-6) if isinstance(sv, float) else sv), sk
        elif k == "completion_probabilities":
            assert [e["id"] for e in got[k]] == [e["id"] for e in v]
            for g, w in zip(got[k], v):
                assert [t["id"] for t in g["top_logprobs"]] == [t["id"] for t in w["top_logprobs"]]
                assert (g["token"], g["bytes"]) == (w["token"], w["bytes"])
                assert g["logprob"] == pytest.approx(w["logprob"], abs=0.02)
        else:
            assert got[k] == v, k
    if "timings" in want:
        assert set(got["timings"]) == set(want["timings"])


def post(srv, c: dict) -> httpx.Response:
    return httpx.post(srv.url + c["path"], json=c["request"], timeout=120)


@pytest.mark.parametrize("name", ["text", "alias", "ids_probs", "mixed", "stop_word", "eos"])
def test_completion_equals_llama_server(smol, name):
    c = case("smollm2", name)
    r = post(smol, c)
    assert r.status_code == 200, r.text
    assert_same_answer(r.json(), c["answer"])


def test_several_prompts_answer_a_list(smol):
    c = case("smollm2", "multi")
    got = post(smol, c).json()
    assert isinstance(got, list) and len(got) == len(c["answer"])
    for g, w in zip(got, c["answer"]):
        assert_same_answer(g, w)


def test_stream_frames_equal_llama_server(smol):
    c = case("smollm2", "stream")
    r = post(smol, c)
    assert r.headers["content-type"].startswith("text/event-stream")
    got = sse_events(r)
    assert "[DONE]" not in got                     # llama-server's native stream has none
    want = c["answer"]
    assert [(f["content"], f["tokens"], f["stop"]) for f in got] == \
        [(f["content"], f["tokens"], f["stop"]) for f in want]
    for g, w in zip(got, want):
        assert_same_answer(g, w)


def progress(frames: list) -> list:
    """(total, cache, processed) of each prompt_progress frame (time_ms depends on the machine)."""
    return [(p["total"], p["cache"], p["processed"])
            for p in (f.get("prompt_progress") for f in frames if isinstance(f, dict)) if p]


def test_return_progress_reports_as_llama_server(smollm2_path):
    """As the prompt starts (its cached part) and after each batch of it, before the first token:
    the same reports as llama-server's, the second chat reusing the first's prompt. (A server of its
    own: ggserve's prompt cache would find more of the chat's prompt in the module's earlier requests
    than llama-server's single slot kept.)"""
    cfg = ServerConfig(model=smollm2_path, n_ctx=2048, n_parallel=1, n_threads=2, n_batch=2048)
    with RunningServer(create_app(cfg)) as srv:
        answers = {name: sse_events(post(srv, case("smollm2", name)))
                   for name in ("stream_progress", "chat_stream_progress", "chat_stream_progress_cached")}
    for name, got in answers.items():
        c = case("smollm2", name)
        assert progress(got) == progress(c["answer"])
        first_text = next(i for i, f in enumerate(got) if isinstance(f, dict) and not f.get("prompt_progress")
                          and (f.get("content") or (f.get("choices") and f["choices"][0]["delta"].get("content"))))
        assert all(not f.get("prompt_progress") for f in got[first_text:] if isinstance(f, dict))
        if name == "stream_progress":
            assert_same_answer({**got[0], "tokens": [0]}, c["answer"][0])   # llama-server's [0]: no token


def test_timings_per_token_on_every_frame(smol):
    """timings_per_token: each frame carries `timings`; a progress frame's count the prompt so far,
    from nothing before its first batch, never going back."""
    body = {"prompt": "the quick brown fox jumps over the lazy dog " * 8, "n_predict": 3, "stream": True,
            "timings_per_token": True, "return_progress": True}
    frames = sse_events(httpx.post(smol.url + "/completion", json=body, timeout=120))
    assert all("timings" in f for f in frames)
    reports = [f for f in frames if "prompt_progress" in f]
    assert reports[0]["timings"]["prompt_n"] == 0 and reports[0]["timings"]["prompt_ms"] == 0.0
    assert reports[-1]["timings"]["prompt_n"] == reports[-1]["prompt_progress"]["processed"] - \
        reports[-1]["prompt_progress"]["cache"]
    ms = [f["timings"]["prompt_ms"] for f in reports]
    assert ms == sorted(ms) and all(v >= 0 for f in frames for v in f["timings"].values())
    assert frames[-1]["timings"]["predicted_n"] == 3


def test_missing_prompt_is_a_400(smol):
    c = case("smollm2", "no_prompt")
    r = post(smol, c)
    assert r.status_code == c["status"] == 400
    assert r.json()["error"]["type"] == c["answer"]["error"]["type"]


def test_bad_prompt_is_a_400_naming_it(smol):
    r = httpx.post(smol.url + "/completion", json={"prompt": [1, 2.5], "n_predict": 1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.post(smol.url + "/completion", json={"prompt": [99999999], "n_predict": 1})
    assert r.status_code == 400 and "out of range" in r.json()["error"]["message"]


def test_multimodal_prompt_is_refused_by_name(smol):
    r = httpx.post(smol.url + "/completion", json={"prompt": {"prompt_string": "<__media__>", "multimodal_data": []}})
    assert r.status_code == 400 and "multimodal_data" in r.json()["error"]["message"]


def test_apply_template_equals_llama_server(smol):
    c = case("smollm2", "apply_template")
    r = post(smol, c)
    assert r.status_code == 200 and r.json() == c["answer"]


def test_logit_bias_by_text_bans_its_tokens(smol):
    """llama-server's logit_bias names tokens by text too; each token of the text is biased."""
    c = case("smollm2", "text")
    want = c["answer"]["tokens"]
    for bias in ([[" Paris", False]], {" Paris": -100}):
        r = httpx.post(smol.url + "/completion", json={**c["request"], "logit_bias": bias}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["tokens"][0] != want[0] and " Paris" not in r.json()["content"]


def test_response_fields_pick_fields(smol):
    r = httpx.post(smol.url + "/completion", json={"prompt": "Hi", "n_predict": 2,
                                                   "response_fields": ["content", "generation_settings/n_predict"]},
                   timeout=120)
    assert set(r.json()) == {"content", "generation_settings/n_predict"}
    assert r.json()["generation_settings/n_predict"] == 2


def test_idle_slot_after_a_completion_shows_no_budget(smol):
    """As llama-server (its tests/unit/test_metrics.py): a finished task's budget does not stay on the slot."""
    assert post(smol, case("smollm2", "alias")).status_code == 200
    for slot in httpx.get(smol.url + "/slots").json():
        assert slot["is_processing"] is False
        assert (slot["next_token"][0]["n_remain"], slot["next_token"][0]["n_decoded"]) == (-1, 0)


def test_v1_completions_stays_openai(smol):
    r = httpx.post(smol.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=120)
    assert r.json()["object"] == "text_completion"


# /infill --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["infill", "infill_prompt", "infill_extra"])
def test_infill_equals_llama_server(qwen, name):
    c = case("qwen3", name)
    r = post(qwen, c)
    assert r.status_code == 200, r.text
    assert_same_answer(r.json(), c["answer"])    # `prompt` is the FIM layout, detokenized


@pytest.mark.parametrize("name", ["infill_no_prefix", "infill_bad_extra"])
def test_infill_bad_request_is_a_400(qwen, name):
    c = case("qwen3", name)
    r = post(qwen, c)
    assert r.status_code == c["status"] == 400, r.text
    if "must" in c["answer"]["error"]["message"]:
        assert r.json()["error"]["message"] == c["answer"]["error"]["message"]


def test_infill_without_fim_tokens_is_a_501(smol):
    c = case("smollm2", "infill_no_fim")
    r = post(smol, c)
    assert r.status_code == c["status"] == 501
    assert r.json()["error"]["message"] == c["answer"]["error"]["message"]
    assert r.json()["error"]["type"] == c["answer"]["error"]["type"]


# /props ---------------------------------------------------------------------------------

# Kept different on purpose (docs/server.md): the model's name as /v1/models gives it, the
# build, and the image marker (llama-server draws a random one per process).
PROPS_OURS = {"model_alias", "model_path", "build_info", "media_marker", "total_slots", "endpoint_props",
              "default_generation_settings"}


@pytest.mark.parametrize("model", ["smollm2", "qwen3"])
def test_props_equal_llama_server(request, model):
    srv = request.getfixturevalue({"smollm2": "smol", "qwen3": "qwen"}[model])
    want = REF["models"][model]["props"]
    got = httpx.get(srv.url + "/props").json()
    assert set(got) == set(want), set(got) ^ set(want)
    for k, v in want.items():
        if k not in PROPS_OURS:
            assert got[k] == v, k
    gs, ws = got["default_generation_settings"], want["default_generation_settings"]
    assert gs["n_ctx"] == ws["n_ctx"]
    assert set(gs["params"]) == set(ws["params"])
    for k, v in ws["params"].items():
        if k not in SETTINGS_OURS:
            assert gs["params"][k] == (pytest.approx(v, rel=1e-6) if isinstance(v, float) else v), k


def test_post_props_needs_the_flag(smol):
    r = httpx.post(smol.url + "/props", json={})
    assert r.status_code == 501 and "--props" in r.json()["error"]["message"]


def test_post_props_with_the_flag(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=512, n_parallel=1, n_threads=2, props_endpoint=True)
    with RunningServer(create_app(cfg)) as srv:
        assert httpx.post(srv.url + "/props", json={}).json() == {"success": True}
        assert httpx.get(srv.url + "/props").json()["endpoint_props"] is True


# metrics --------------------------------------------------------------------------------

def metric_lines(text: str) -> dict:
    """llamacpp:* series -> (HELP, TYPE, value)."""
    out, help_, kind = {}, {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP llamacpp:"):
            name, _, h = line[len("# HELP "):].partition(" ")
            help_[name] = h
        elif line.startswith("# TYPE llamacpp:"):
            name, _, k = line[len("# TYPE "):].partition(" ")
            kind[name] = k
        elif line.startswith("llamacpp:"):
            name, _, v = line.partition(" ")
            out[name] = (help_[name], kind[name], float(v))
    return out


def test_llamacpp_metrics_equal_llama_server(smollm2_path):
    """A fresh server, one /completion: llama-server's series, help texts and types, and the
    same counts (times differ: only checked to be positive)."""
    want = metric_lines(REF["models"]["smollm2"]["metrics"])
    cfg = ServerConfig(model=smollm2_path, n_ctx=2048, n_parallel=1, n_threads=2, metrics=True)
    with RunningServer(create_app(cfg)) as srv:
        c = case("smollm2", "text")
        assert post(srv, c).status_code == 200
        r = httpx.get(srv.url + "/metrics")
        text = r.text
    assert abs(int(r.headers["Process-Start-Time-Unix"]) - time.time()) < 600
    assert b"Process-Start-Time-Unix" in [k for k, _ in r.headers.raw]   # llama-server's capitals
    got = metric_lines(text)
    assert "ggserve_generated_tokens_total 8.0" in text          # ours stay beside them
    assert set(got) == set(want)
    timed = {"llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total",
             "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds"}
    for name, (h, k, v) in want.items():
        assert got[name][:2] == (h, k), name
        if name in timed:
            assert got[name][2] > 0, name
        else:
            assert got[name][2] == v, name
