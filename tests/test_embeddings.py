"""Embeddings (/v1/embeddings, /embeddings, /embedding) against llama-server 11434's
answers for the same models, inputs and pooling (tests/data/embeddings, how they were
made in its README): cosine >= 0.9999 and max abs difference <= 1e-3 per vector.
Embedding requests batched with streaming chats leave the chats' answers unchanged.
The official openai SDKs (Python; Node when tests/node is installed) read them.

Default run: a few representative inputs per (model, pooling); every input with -m slow.
"""
from __future__ import annotations

import base64
import json
import pathlib
import shutil
import subprocess
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from ggserve.models.tokenizer import Tokenizer
from ggserve.native.gguf_file import GGUFFile
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.api.openai.embeddings import tokenize_inputs
from ggserve.server.engine.pooling import Pool, normalize
from server_harness import RunningServer

DATA = pathlib.Path(__file__).parent / "data" / "embeddings"
NODE = pathlib.Path(__file__).parent / "node"
REF = json.loads((DATA / "reference.json").read_text())
N_INPUTS = len(REF["texts"])


def reference(model: str) -> dict:
    with np.load(DATA / f"{model}.npz") as z:
        return {k: z[k] for k in z.files}


def assert_close(got, want, scale: float = 1.0):
    """llama-server's vector within the issue's bounds (max abs difference relative to
    `scale` for vectors that are not normalized)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    cos = got @ want / (np.linalg.norm(got) * np.linalg.norm(want))
    diff = np.abs(got - want).max()
    assert cos >= 0.9999 and diff <= 1e-3 * scale, (cos, diff)


def server(model_path: str, pooling: str | None, **kw) -> RunningServer:
    cfg = ServerConfig(model=model_path, n_ctx=kw.pop("n_ctx", 4096), n_parallel=kw.pop("n_parallel", 4),
                       n_threads=2, embeddings=kw.pop("embeddings", True), pooling=pooling, **kw)
    return RunningServer(create_app(cfg))


@pytest.fixture(scope="module")
def paths(smollm2_path, gemma3_path):
    return {"smollm2": smollm2_path, "gemma3": gemma3_path}


@pytest.fixture(scope="module")
def smol_mean(smollm2_path):
    with server(smollm2_path, "mean") as srv:
        yield srv


def inputs_sent(model: str) -> list:
    return REF["models"][model]["inputs_sent"]


def post(srv, body: dict, path: str = "/v1/embeddings") -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=600)


# -- llama-server's numbers -----------------------------------------------------------

# one token, unicode, and ~1,000 tokens (SmolLM2) or ~220 (Gemma 3, the slower model)
FEW = {"smollm2": [0, 7, 19], "gemma3": [0, 7, 15]}
CASES = [pytest.param(m, p, FEW[m] if p == "mean" else [0, 13], id=f"{m}-{p}")
         for m in ("smollm2", "gemma3") for p in ("mean", "last", "cls")]
CASES += [pytest.param(m, p, list(range(N_INPUTS)), id=f"{m}-{p}-all", marks=pytest.mark.slow)
          for m in ("smollm2", "gemma3") for p in ("mean", "last", "cls")]


@pytest.mark.parametrize("model,pooling,cases", CASES)
def test_equal_to_llama_server(paths, model, pooling, cases):
    want = reference(model)[pooling]
    ins = inputs_sent(model)
    with server(paths[model], pooling) as srv:
        # all in one request: the scheduler batches them together
        r = post(srv, {"input": [ins[i] for i in cases], "model": "any"})
    assert r.status_code == 200, r.text
    d = r.json()
    assert [e["index"] for e in d["data"]] == list(range(len(cases)))
    for e, i in zip(d["data"], cases):
        assert_close(e["embedding"], want[i])
    counts = REF["models"][model][f"prompt_tokens_{pooling}"]
    assert d["usage"] == {"prompt_tokens": sum(counts[i] for i in cases),
                          "total_tokens": sum(counts[i] for i in cases)}


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_inputs_tokenized_as_llama_server(paths, model):
    """Every input (strings with BOS where the GGUF adds it, special tokens parsed) gets
    llama-server's token ids, and its usage count."""
    tok = Tokenizer.from_metadata(GGUFFile(paths[model]).metadata)
    info = REF["models"][model]
    assert tokenize_inputs(tok, info["inputs_sent"]) == info["tokens"]
    assert [len(t) for t in info["tokens"]] == info["prompt_tokens_mean"]
    # a list mixing strings and ids is one input; BOS only before a first string
    hello = info["inputs_sent"][0]
    assert tokenize_inputs(tok, [hello[0], " world"]) == [hello + tok.encode(" world", add_special=False)]
    assert tokenize_inputs(tok, ["Hi", hello[0]]) == [tok.encode("Hi", add_special=True) + hello]


def test_token_id_lists_equal_the_strings(smol_mean):
    """input as a list of token-id lists: each is one input, llama-server's vector."""
    toks = REF["models"]["smollm2"]["tokens"]
    r = post(smol_mean, {"input": [toks[2], toks[5]]})
    want = reference("smollm2")["mean"]
    assert_close(r.json()["data"][0]["embedding"], want[2])
    assert_close(r.json()["data"][1]["embedding"], want[5])


def test_content_text_parts_equal_the_string(smol_mean):
    """{"content": [text parts]}: the parts' text joined (llama-server's tokenize_oai_content_array)."""
    r = post(smol_mean, {"input": ["hello world", {"content": [{"type": "text", "text": "hello "},
                                                               {"type": "text", "text": "world"}]}]})
    assert r.status_code == 200
    a, b = (d["embedding"] for d in r.json()["data"])
    assert a == b and r.json()["usage"]["prompt_tokens"] == 2 * 2


def test_a_list_longer_than_the_queue(smol_mean):
    """OpenAI takes up to 2048 inputs in one request: more than --parallel + --max-queue
    (4 + 64) all come back, in order, not a 429."""
    toks = REF["models"]["smollm2"]["tokens"]
    want = reference("smollm2")["mean"]
    r = post(smol_mean, {"input": [toks[0], toks[1]] * 35})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [e["index"] for e in data] == list(range(70))
    for k, e in enumerate(data):
        assert_close(e["embedding"], want[k % 2])


def test_embd_normalize_minus_one_is_the_raw_mean(smol_mean):
    want = reference("smollm2")["mean_unnormalized_0_2_19"]
    ins = inputs_sent("smollm2")
    for row, i in enumerate((0, 2)):
        got = post(smol_mean, {"input": ins[i], "embd_normalize": -1}).json()["data"][0]["embedding"]
        assert_close(got, want[row], scale=np.abs(want[row]).max())


def test_native_shape(smol_mean):
    """/embeddings and /embedding answer llama-server's native shape: a list of
    {index, embedding: [vector]} (also for `content`)."""
    ins = inputs_sent("smollm2")
    want = reference("smollm2")["mean"]
    for path, body in (("/embeddings", {"input": [ins[2], ins[3]]}), ("/embedding", {"content": ins[2]})):
        d = post(smol_mean, body, path).json()
        assert [e["index"] for e in d] == list(range(len(d)))
        for e, i in zip(d, (2, 3)):
            assert len(e["embedding"]) == 1
            assert_close(e["embedding"][0], want[i])


# -- errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("body,param,message", [
    ({"input": ""}, "input", "Input content cannot be empty"),
    ({"input": []}, "input", '"input" must not be empty'),
    ({"model": "m"}, "input", '"input" or "content" must be provided'),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format", "encoding_format must be float or base64"),
    ({"input": [1, 2, 10**9]}, "input", "input has token id 1000000000, out of the vocabulary (0..49151)"),
    ({"input": [{"text": "x"}]}, "input",
     "each input must be a string, a list of token ids, or a list of strings and token ids"),
    ({"input": "x", "embd_normalize": -2}, "embd_normalize", None),
    ({"input": {"content": "x"}}, "input", '"content" must be an array'),
    ({"input": {"content": [{"type": "unknown"}]}}, "input", "unsupported content[].type"),
    ({"input": {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}},
     "input", "image_url input is not supported for embeddings by this server"),
])
def test_bad_input_is_a_400(smol_mean, body, param, message):
    r = post(smol_mean, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    if message is not None:
        assert err["message"] == message


def test_over_long_input_is_a_400_and_nothing_else_breaks(smollm2_path):
    with server(smollm2_path, "mean", n_ctx=512, n_parallel=2) as srv:
        r = post(srv, {"input": [[28] * 256, [28] * 257]})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert "256 tokens" in r.json()["error"]["message"] and "257 tokens" in r.json()["error"]["message"]
        # the whole context is fine, and the server goes on
        assert post(srv, {"input": [[28] * 256]}).status_code == 200


def test_off_without_embeddings_flag(smollm2_path):
    with server(smollm2_path, None, embeddings=False) as srv:
        r = post(srv, {"input": "hello"})
    assert r.status_code == 501
    assert r.json()["error"]["message"] == "This server does not support embeddings. Start it with `--embeddings`"


def test_gguf_default_pooling_none(paths):
    """Neither GGUF sets a pooling: none, as llama-server. /v1/embeddings refuses it with
    llama-server's 400; /embedding gives each token's vector, not normalized."""
    want_err = REF["models"]["smollm2"]["none_oai_error"]
    ins = inputs_sent("smollm2")
    ref = reference("smollm2")
    with server(paths["smollm2"], None) as srv:
        r = post(srv, {"input": ins[2]})
        assert r.status_code == want_err["status"] == 400
        assert r.json()["error"]["message"] == want_err["body"]["error"]["message"]
        for i in (1, 2):
            got = post(srv, {"content": ins[i]}, "/embedding").json()[0]["embedding"]
            want = ref[f"none_{i}"]
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert_close(g, w, scale=np.abs(w).max())


# -- batched with generation -------------------------------------------------------------

CHATS = ["Name three colours.", "What is 2 + 2?", "Write a haiku about the sea.", "Say hello in French."]


def _chat_stream(url: str, prompt: str, out: dict, key) -> None:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 24, "temperature": 0, "stream": True}
    text = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                text.append(delta.get("content") or "")
    out[key] = "".join(text)
    out[("done", key)] = time.monotonic()


def test_embeddings_interleaved_with_streaming_chats(smollm2_path):
    """Four streaming chats, embedding requests posted while they stream: every chat
    answers exactly what it answers alone, and embeddings come back (equal to
    llama-server's) before the chats end: the scheduler runs them in the same steps."""
    ins, want = inputs_sent("smollm2"), reference("smollm2")["mean"]
    with server(smollm2_path, "mean", n_parallel=6, n_ctx=6 * 1024) as srv:
        solo = {}
        for i, p in enumerate(CHATS):
            _chat_stream(srv.url, p, solo, i)
        together = {}
        threads = [threading.Thread(target=_chat_stream, args=(srv.url, p, together, i)) for i, p in enumerate(CHATS)]
        for t in threads:
            t.start()
        finished_embeddings = []
        while any(t.is_alive() for t in threads):
            d = post(srv, {"input": [ins[13], ins[2]]}).json()
            finished_embeddings.append(time.monotonic())
            for e, i in zip(d["data"], (13, 2)):
                assert_close(e["embedding"], want[i])
        for t in threads:
            t.join()
    assert [together[i] for i in range(4)] == [solo[i] for i in range(4)]
    assert all(solo[i] for i in range(4))
    last_chat = max(together[("done", i)] for i in range(4))
    assert sum(t < last_chat for t in finished_embeddings) >= 1


# -- the official SDKs -----------------------------------------------------------------------

def test_openai_python_sdk_float_and_base64(smol_mean):
    client = openai.OpenAI(base_url=smol_mean.url + "/v1", api_key="none", max_retries=0)
    text = REF["texts"][5]
    want = reference("smollm2")["mean"][5]
    as_float = client.embeddings.create(model="text-embedding-3-small", input=text, encoding_format="float")
    as_b64 = client.embeddings.create(model="text-embedding-3-small", input=[text, text])  # SDK default: base64
    assert_close(as_float.data[0].embedding, want)
    assert [d.embedding for d in as_b64.data] == [as_float.data[0].embedding] * 2
    assert as_float.usage.prompt_tokens == REF["models"]["smollm2"]["prompt_tokens_mean"][5]
    raw = httpx.post(smol_mean.url + "/v1/embeddings", json={"input": text, "encoding_format": "base64"}).json()
    assert np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4").tolist() == as_float.data[0].embedding


@pytest.mark.skipif(shutil.which("node") is None or not (NODE / "node_modules" / "openai").exists(),
                    reason="node or tests/node/node_modules (npm ci) missing")
def test_openai_node_sdk_float_and_base64(smol_mean):
    text = REF["texts"][5]
    out = subprocess.run(["node", str(NODE / "embeddings.mjs"), smol_mean.url + "/v1", text],
                         capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout)
    assert_close(got["float"], reference("smollm2")["mean"][5])
    assert got["base64"] == [got["float"]] * 2
    assert got["usage"]["prompt_tokens"] == REF["models"]["smollm2"]["prompt_tokens_mean"][5]


# -- pooling and normalization, literal ---------------------------------------------------------

def test_normalize_as_llama_cpp():
    v = np.array([3.0, -4.0], np.float32)
    assert normalize(v, 2).tolist() == pytest.approx([0.6, -0.8])
    assert normalize(v, 1).tolist() == pytest.approx([3 / 7, -4 / 7])
    assert normalize(v, 0).tolist() == pytest.approx([3 * 32760 / 4, -32760.0])
    assert normalize(v, -1).tolist() == [3.0, -4.0]
    assert normalize(v, 3).tolist() == pytest.approx((v / 91 ** (1 / 3)).tolist())
    assert normalize(np.zeros(2, np.float32), 2).tolist() == [0.0, 0.0]


def test_pool_rows_per_chunk():
    """Which rows of a chunk each pooling reads (prompt of 10 tokens in chunks 0-6, 6-10)."""
    assert Pool("mean", 10).rows(6, 4).tolist() == [0, 1, 2, 3]
    assert Pool("cls", 10).rows(0, 6).tolist() == [0] and Pool("cls", 10).rows(6, 4).tolist() == []
    assert Pool("last", 10).rows(0, 6).tolist() == [] and Pool("last", 10).rows(6, 4).tolist() == [3]
    p = Pool("mean", 3)
    p.add(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    p.add(np.array([[5.0, 9.0]], np.float32))
    assert p.result().tolist() == [[3.0, 5.0]]
