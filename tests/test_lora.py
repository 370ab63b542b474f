"""LoRA adapters and control vectors against llama-server 11434's answers (tests/data/lora:
how they were made) on synthetic adapters for SmolLM2 and the synthetic Qwen3: greedy
tokens equal with no adapter, each alone, a mix of two with scales and the server-wide
scales; /lora-adapters GET/POST as llama-server; requests with different adapter sets
batched together give their solo answers; no cached prefix crosses adapter sets."""
import json
import pathlib
import subprocess
import sys

import httpx
import numpy as np
import pytest
from engine_helpers import generate_requests, tokens
from gguf import GGMLQuantizationType, GGUFWriter
from server_harness import RunningServer

from ggserve.models.registry import ModelError
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.cli.adapter_flags import adapter_config
from ggserve.server.cli.main import serve_parser
from ggserve.server.engine.adapters import AdapterConfig
from ggserve.server.engine.engine import Engine, EngineConfig, Request
from ggserve.server.engine.sampling.sampler import SamplingParams

DATA = pathlib.Path(__file__).parent / "data" / "lora"
REF = json.loads((DATA / "reference.json").read_text())
sys.path.insert(0, str(DATA))
from make_adapters import make_all  # (the folder joins sys.path above)

QWEN3 = "/work/shared/golden/synth/models/synth-qwen3-q8_0.gguf"
GREEDY = SamplingParams(temperature=0.0, n_probs=5)
# llama-server's answers come from the AVX2 build of the golden data, as ggserve's ggml: greedy
# tokens equal up to a near tie of llama-server's (its top two within NEAR_TIE), top-5 logprobs
# within LOGPROB_TOL at every step before it.
NEAR_TIE = 0.05
LOGPROB_TOL = 0.01
LORA_SERVERS = ("smollm2_lora", "qwen3_lora")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The adapters, made again: the very files llama-server answered with."""
    out = tmp_path_factory.mktemp("lora")
    assert make_all(str(out)) == REF["files"]
    return out


def model_path(server: str, smollm2_path: str) -> str:
    return smollm2_path if server.startswith("smollm2") else QWEN3


def config(server: str, files) -> object:
    """The AdapterConfig of llama-server's flags for `server`, read by ggserve's flag parser."""
    flags = [str(files / f) if f.endswith(".gguf") or ".gguf:" in f else f
             for f in REF["servers"][server]["command"][11:]]
    return adapter_config(serve_parser().parse_args(["-m", "x.gguf", *flags]))


def adapters_of(lora, defaults) -> tuple:
    """A request's `lora` as the engine takes it: (id, scale) with non-zero scales."""
    scales = list(defaults) if not lora else [0.0] * len(defaults)
    for e in lora or ():
        scales[e["id"]] = e["scale"]
    return tuple((i, s) for i, s in enumerate(scales) if s)


def engine_for(server: str, files, smollm2_path, n_parallel: int = 8) -> Engine:
    return Engine(EngineConfig(model_path(server, smollm2_path), n_ctx=2048 * n_parallel, n_parallel=n_parallel,
                               n_threads=2, adapters=config(server, files)))


@pytest.fixture(scope="module")
def smol_server(files, smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=2048, n_parallel=1, n_threads=2,
                       adapters=config("smollm2_lora", files))
    with RunningServer(create_app(cfg)) as srv:
        yield srv


def reference_steps(case: dict) -> dict[int, list]:
    """llama-server's top-5 by step. It lists none for a token that leaves UTF-8 incomplete
    (server-context.cpp process_token); greedy, each list's best is its own step's token."""
    steps, j = {}, 0
    for top in case["top_logprobs"]:
        while case["tokens"][j] != top[0][0]:
            j += 1
        steps[j] = top
        j += 1
    return steps


def assert_as_llama_server(ours: list[int], top: list[dict], case: dict) -> None:
    """ours: the generated tokens; top: per step {token: logprob} of ggserve's top-5."""
    want, theirs = case["tokens"], reference_steps(case)
    # the first step where the answers part (one of them may end there, at an end-of-generation token)
    i = next((k for k, (a, b) in enumerate(zip(ours, want)) if a != b), min(len(ours), len(want)))
    for step in range(i):
        for token, logprob in theirs.get(step, ()):
            if token in top[step]:
                assert abs(top[step][token] - logprob) <= LOGPROB_TOL, (step, token, top[step][token], logprob)
    if ours == want:
        return
    if i in theirs:          # llama-server's own top two there
        first, second = theirs[i][:2]
        gap = first[1] - second[1]
    else:                    # llama-server ended here or listed nothing: ggserve's top two
        first, second = sorted(top[i].values(), reverse=True)[:2]
        gap = first - second
    assert gap < NEAR_TIE, f"parted at step {i} of {len(want)}: {ours[i:i + 1]} vs {want[i:i + 1]}"


def assert_events_as_llama_server(events, case: dict) -> None:
    assert_as_llama_server(tokens(events), [dict(e.top_logprobs) for e in events if e.token is not None], case)


def complete(srv, case: dict) -> dict:
    r = httpx.post(srv.url + "/completion", json=case["request"], timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("name", ["default", "none", "a", "b", "mix"])
def test_completion_with_each_adapter_set_equals_llama_server(smol_server, name):
    for case in REF["servers"]["smollm2_lora"]["cases"][name]:
        got = complete(smol_server, case)
        top = [{t["id"]: t["logprob"] for t in p["top_logprobs"]} for p in got["completion_probabilities"]]
        assert_as_llama_server(got["tokens"], top, case)


@pytest.fixture(scope="module")
def qwen_server(files):
    cfg = ServerConfig(model=QWEN3, n_ctx=2048, n_parallel=1, n_threads=2, adapters=config("qwen3_lora", files))
    with RunningServer(create_app(cfg)) as srv:
        yield srv


def assert_chat_as_llama_server(got: str, want: str) -> None:
    """The chat's text as llama-server's. Without the request's adapters (the server's own scales:
    1 and 0.5 against the mix's 0.5 and 1.5) the answers part at once."""
    assert got == want


def test_chat_with_a_mix_of_two_adapters_equals_llama_server(qwen_server):
    want = REF["servers"]["qwen3_lora"]["chat_mix"]
    r = httpx.post(qwen_server.url + "/v1/chat/completions", json=want["request"], timeout=300)
    assert_chat_as_llama_server(r.json()["choices"][0]["message"]["content"], want["content"])


def test_responses_and_messages_take_the_lora_field(qwen_server):
    want = REF["servers"]["qwen3_lora"]["chat_mix"]
    body = want["request"]
    r = httpx.post(qwen_server.url + "/v1/responses", json={
        "input": body["messages"][0]["content"], "max_output_tokens": body["max_tokens"], "temperature": 0,
        "lora": body["lora"]}, timeout=300)
    assert_chat_as_llama_server(r.json()["output"][-1]["content"][0]["text"], want["content"])
    r = httpx.post(qwen_server.url + "/v1/messages", json={
        "model": "any", "messages": body["messages"], "max_tokens": body["max_tokens"], "temperature": 0,
        "lora": body["lora"]}, timeout=300)
    assert_chat_as_llama_server(r.json()["content"][0]["text"], want["content"])


def basenames(listing: list) -> list:
    return [{**e, "path": pathlib.Path(e["path"]).name} for e in listing]


def test_lora_adapters_lists_as_llama_server(smol_server):
    got = httpx.get(smol_server.url + "/lora-adapters").json()
    assert basenames(got) == REF["servers"]["smollm2_lora"]["adapters"]


def test_post_lora_adapters_sets_the_server_scales_as_llama_server(smol_server):
    want = REF["servers"]["smollm2_lora"]["post"]
    before = httpx.get(smol_server.url + "/lora-adapters").json()
    r = httpx.post(smol_server.url + "/lora-adapters", json=want["request"])
    try:
        assert (r.status_code, r.json()) == (want["status"], want["response"])
        assert basenames(httpx.get(smol_server.url + "/lora-adapters").json()) == want["adapters_after"]
        for case in want["cases"]:
            got = complete(smol_server, case)
            top = [{t["id"]: t["logprob"] for t in p["top_logprobs"]} for p in got["completion_probabilities"]]
            assert_as_llama_server(got["tokens"], top, case)
    finally:
        httpx.post(smol_server.url + "/lora-adapters", json=[{"id": e["id"], "scale": e["scale"]} for e in before])


@pytest.mark.parametrize("lora, says", [
    ([{"id": 2, "scale": 1.0}], "id 2 is not a loaded adapter"),
    ([{"id": 0, "scale": "1"}], "scale of adapter 0 must be a finite number"),
    ({"id": 0, "scale": 1.0}, "must be an array"),
])
def test_bad_lora_field_is_a_400_naming_it(smol_server, lora, says):
    r = httpx.post(smol_server.url + "/completion", json={"prompt": "Hi", "n_predict": 1, "lora": lora})
    assert r.status_code == 400
    assert says in r.json()["error"]["message"] and r.json()["error"]["param"] == "lora"


def test_post_lora_adapters_needs_an_array(smol_server):
    r = httpx.post(smol_server.url + "/lora-adapters", json={"id": 0, "scale": 1.0})
    assert r.status_code == 400 and "must be an array" in r.json()["error"]["message"]


@pytest.mark.parametrize("server", LORA_SERVERS)
def test_eight_requests_over_four_adapter_sets_in_one_batch_equal_their_solo_answers(server, files, smollm2_path):
    ref = REF["servers"][server]
    engine = engine_for(server, files, smollm2_path)
    try:
        defaults = engine.loaded.adapters.scales
        requests, want = [], {}
        for name in ("none", "a", "b", "mix"):
            for j, case in enumerate(ref["cases"][name]):
                rid = f"{name}-{j}"
                requests.append(Request(rid, prompt_ids(engine, case), GREEDY,
                                        max_tokens=REF["n_predict"],
                                        adapters=adapters_of(case["request"].get("lora"), defaults)))
                want[rid] = case
        events = generate_requests(engine, requests)
        for rid, case in want.items():
            assert_events_as_llama_server(events[rid], case)
    finally:
        engine.close()


def prompt_ids(engine: Engine, case: dict) -> list[int]:
    return engine.tokenizer.encode(case["request"]["prompt"], add_special=True, parse_special=True)


def test_a_cached_prefix_is_not_reused_across_adapter_sets(files, smollm2_path):
    ref = REF["servers"]["qwen3_lora"]["cases"]
    engine = engine_for("qwen3_lora", files, smollm2_path, n_parallel=1)
    try:
        defaults = engine.loaded.adapters.scales
        runs = []
        for name in ("a", "b", "b"):
            case = ref[name][1]
            ev = generate_requests(engine, [Request(name, prompt_ids(engine, case), GREEDY, max_tokens=REF["n_predict"],
                                                    adapters=adapters_of(case["request"]["lora"], defaults))])[name]
            runs.append((tokens(ev) == case["tokens"], ev[-1].n_cached > 0))
        # b after a: nothing cached, llama-server's answer; b again: its own prefix reused
        assert runs == [(True, False), (True, False), (True, True)]
    finally:
        engine.close()


@pytest.mark.parametrize("server", ["smollm2_cvec", "qwen3_cvec", "smollm2_init_without_apply"])
def test_control_vectors_and_init_without_apply_equal_llama_server(server, files, smollm2_path):
    engine = engine_for(server, files, smollm2_path, n_parallel=1)
    try:
        defaults = engine.loaded.adapters.scales
        for j, case in enumerate(REF["servers"][server]["cases"]["default"]):
            ev = generate_requests(engine, [Request(str(j), prompt_ids(engine, case), GREEDY,
                                                    max_tokens=REF["n_predict"], adapters=adapters_of(None, defaults))])
            assert_events_as_llama_server(ev[str(j)], case)
    finally:
        engine.close()


@pytest.mark.parametrize("name", ["default", "none", "a", "b", "mix"])
def test_qwen3_each_adapter_set_alone_equals_llama_server(name, qwen3_engine):
    defaults = qwen3_engine.loaded.adapters.scales
    for j, case in enumerate(REF["servers"]["qwen3_lora"]["cases"][name]):
        ev = generate_requests(qwen3_engine, [Request(str(j), prompt_ids(qwen3_engine, case), GREEDY,
                                                      max_tokens=REF["n_predict"],
                                                      adapters=adapters_of(case["request"].get("lora"), defaults))])
        assert_events_as_llama_server(ev[str(j)], case)


@pytest.fixture(scope="module")
def qwen3_engine(files, smollm2_path):
    engine = engine_for("qwen3_lora", files, smollm2_path, n_parallel=1)
    yield engine
    engine.close()


def test_adapter_for_another_architecture_exits_1_naming_the_file(files, smollm2_path):
    r = subprocess.run([sys.executable, "-m", "ggserve.server.cli.main", "serve", "-m", smollm2_path, "-t", "1",
                        "--lora", str(files / "qwen3-lora-a.gguf")], check=False, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1
    assert "qwen3-lora-a.gguf" in r.stderr and "'qwen3'" in r.stderr


def test_adapter_of_the_wrong_shape_names_the_tensor(tmp_path, smollm2_path):
    path = str(tmp_path / "wrong.gguf")
    w = GGUFWriter(path, "llama")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 8.0)
    f32 = GGMLQuantizationType.F32
    w.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((8, 512), np.float32), raw_dtype=f32)   # n_embd is 576
    w.add_tensor("blk.0.attn_q.weight.lora_b", np.zeros((576, 8), np.float32), raw_dtype=f32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match=r"wrong\.gguf.*'blk\.0\.attn_q\.weight'"):
        Engine(EngineConfig(smollm2_path, n_ctx=512, n_parallel=1, adapters=AdapterConfig(lora=((path, 1.0),))))
