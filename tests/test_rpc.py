"""ggml's RPC backend on loopback: two `ggserve rpc-server` workers and `ggserve serve
--rpc A,B -ngl 99 -ts 1,1` (docs/deploy.md).

The workers run the same ggml CPU kernels as a local run (same library), so the
answers must be the same to the bit: greedy tokens and logprobs equal a local
server's on the golden prompts (themselves checked against llama.cpp in
test_engine_golden.py). A worker killed mid-stream ends the stream with an error
event, the server stays up and /health names the lost worker.
"""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import httpx
import pytest

from ggserve.native import ggml
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.engine.loader import assign_layers
from server_harness import RunningServer

GGSERVE = str(pathlib.Path(sys.executable).parent / "ggserve")
DATA = json.loads((pathlib.Path(__file__).parent / "data" / "completions.json").read_text())
CASES = {c["key"]: c for c in DATA["models"]["smollm2"]}
DEFAULT_KEYS = ("capital", "code_fib", "long_prose")      # short, code, two ubatches of prompt
SERVE_ARGS = ["-c", "4096", "-np", "2", "-t", "1", "--no-webui"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, what: str, proc: subprocess.Popen, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: exited with {proc.returncode}")
        try:
            if check():
                return
        except (OSError, httpx.HTTPError):
            pass
        time.sleep(0.1)
    raise TimeoutError(what)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Workers:
    def __init__(self, n: int, log_dir: pathlib.Path):
        self.endpoints, self.procs = [], []
        for i in range(n):
            ep = f"127.0.0.1:{free_port()}"
            log = open(log_dir / f"worker{i}.log", "wb")
            self.procs.append(subprocess.Popen([GGSERVE, "rpc-server", "-p", ep.split(":")[1], "-t", "1"],
                                               stdout=log, stderr=subprocess.STDOUT))
            self.endpoints.append(ep)
        for ep, p in zip(self.endpoints, self.procs):
            wait_for(lambda: ggml.rpc_hello(ep), f"rpc-server {ep}", p, 60)

    def close(self):
        for p in self.procs:
            stop(p)


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    w = Workers(2, tmp_path_factory.mktemp("rpc"))
    yield w
    w.close()


def serve_rpc(workers: Workers, model: str, log_path: pathlib.Path):
    """`ggserve serve --rpc` on the workers, every layer there, half each; (url, process)."""
    port = free_port()
    proc = subprocess.Popen([GGSERVE, "serve", "-m", model, "--port", str(port), *SERVE_ARGS,
                             "--rpc", ",".join(workers.endpoints), "-ngl", "99", "-ts", "1,1"],
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: httpx.get(url + "/health").status_code == 200, "ggserve serve --rpc", proc)
    return url, proc


@pytest.fixture(scope="module")
def rpc_server(workers, smollm2_path, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    url, proc = serve_rpc(workers, smollm2_path, log_path)
    yield url, proc, log_path
    stop(proc)


@pytest.fixture(scope="module")
def local_server(smollm2_path):
    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=4096, n_parallel=2, n_threads=1,
                                               webui=False))) as s:
        yield s.url


def complete(url: str, case: dict) -> dict:
    r = httpx.post(url + "/v1/completions", timeout=300, json={
        "prompt": case["prompt_ids"], "max_tokens": len(case["generated_ids"]), "temperature": 0,
        "logprobs": 5, "ignore_eos": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return {"text": choice["text"], "logprobs": choice["logprobs"]}


def _cases(keys):
    return [pytest.param(k, id=k, marks=() if k in DEFAULT_KEYS else pytest.mark.slow) for k in keys]


@pytest.mark.parametrize("key", _cases(CASES))
def test_split_over_two_workers_answers_as_local(rpc_server, local_server, key):
    remote, local = complete(rpc_server[0], CASES[key]), complete(local_server, CASES[key])
    assert remote["logprobs"]["tokens"] == local["logprobs"]["tokens"]
    assert remote == local          # text, and every logprob to the bit
    if key in ("capital", "code_fib"):   # and llama.cpp's own greedy text (its golden data, made
        # with -t 2; on long_prose llama-server -t 1 answers otherwise from token 3 too)
        gold = httpx.post(local_server + "/detokenize", json={"tokens": CASES[key]["generated_ids"]}).json()
        assert remote["text"] == gold["content"]


def test_memory_report_lists_each_worker(rpc_server, workers):
    log = rpc_server[2].read_text()
    for i, ep in enumerate(workers.endpoints):
        assert f"RPC{i} ({ep}): weights " in log, log[-2000:]
    # -ngl 99 -ts 1,1 over 30 layers + output: 16 and 15 layers, the (tied) output on RPC1
    assert "CPU (" in log


def test_layers_placed_as_llama_cpp():
    a, b, cpu = "RPC0", "RPC1", "CPU"

    class Dev:            # assign_layers asks a device only for its memory (default split)
        def __init__(self, free):
            self.free = free

        def memory(self):
            return self.free, 2 * self.free

    # llama-model.cpp: layers i_gpu_start = n_layer + 1 - ngl.. (the output counts as layer n_layer)
    assert assign_layers(30, 99, [a, b], cpu, (1, 1)) == [a] * 16 + [b] * 15
    assert assign_layers(30, 1, [a, b], cpu, (1, 1)) == [cpu] * 30 + [a]
    assert assign_layers(30, 10, [a, b], cpu, (3, 1)) == [cpu] * 21 + [a] * 8 + [b] * 2
    assert assign_layers(30, 0, [a, b], cpu, (1, 1)) == [cpu] * 31
    d1, d2 = Dev(3 << 30), Dev(1 << 30)         # no -ts: by free memory, 3:1
    assert assign_layers(7, 99, [d1, d2], cpu) == [d1] * 6 + [d2] * 2


def test_unreachable_worker_is_an_error_at_start(smollm2_path):
    ep = f"127.0.0.1:{free_port()}"          # nothing listens there
    t0 = time.monotonic()
    r = subprocess.run([GGSERVE, "serve", "-m", smollm2_path, "--port", str(free_port()), "--rpc", ep,
                        "-ngl", "99"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert f"RPC worker {ep} is unreachable" in r.stderr
    assert time.monotonic() - t0 < 30


def test_busy_worker_is_an_error_at_start(smollm2_path, tmp_path):
    """A worker serves one client at a time: a second server is told so, not left hanging."""
    w = Workers(1, tmp_path)
    try:
        with socket.create_connection(("127.0.0.1", int(w.endpoints[0].split(":")[1]))):   # the first client
            r = subprocess.run([GGSERVE, "serve", "-m", smollm2_path, "--port", str(free_port()),
                                "--rpc", w.endpoints[0], "-ngl", "99"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert f"RPC worker {w.endpoints[0]} is unreachable: no answer to the handshake" in r.stderr
    finally:
        w.close()


def test_rpc_server_help_warns_no_authentication():
    r = subprocess.run([GGSERVE, "rpc-server", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "WARNING: the RPC protocol has no authentication" in " ".join(r.stdout.split())
    assert "default: 127.0.0.1" in r.stdout


LLAMA_RPC_SERVER = os.environ.get("GGSERVE_LLAMA_RPC_SERVER")     # llama.cpp's rpc-server (ggml-rpc-server)


@pytest.mark.skipif(not LLAMA_RPC_SERVER, reason="GGSERVE_LLAMA_RPC_SERVER (llama.cpp's rpc-server binary) not set")
def test_llama_cpp_rpc_servers_answer_as_local(smollm2_path, tmp_path):
    """Interoperability: workers that are llama.cpp's own rpc-server (same ggml, build 11434)."""
    from ggserve.server.engine.engine import EngineConfig, Engine
    from engine_helpers import generate

    eps = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    procs = [subprocess.Popen([LLAMA_RPC_SERVER, "-p", ep.split(":")[1], "-t", "1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for ep in eps]
    try:
        for ep, p in zip(eps, procs):
            wait_for(lambda: ggml.rpc_hello(ep), f"llama.cpp rpc-server {ep}", p, 60)
        runs = {}
        for name, kw in (("local", {}), ("rpc", {"rpc": tuple(eps), "n_gpu_layers": 99, "tensor_split": (1, 1)})):
            e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_parallel=1, n_threads=1, **kw))
            runs[name] = [[(ev.token, ev.top_logprobs) for ev in generate(e, {"r": CASES[k]["prompt_ids"]},
                                                                             len(CASES[k]["generated_ids"]))["r"]]
                          for k in DEFAULT_KEYS]
            e.close()
        assert runs["rpc"] == runs["local"]
    finally:
        for p in procs:
            stop(p)


@pytest.mark.slow
def test_image_prompt_over_workers_answers_as_local(smollm2_path, mmproj_dir, tmp_path):
    """The projector runs locally; the image's rows go to the first layer's device (a worker)."""
    import hashlib

    from PIL import Image

    from ggserve.server.engine.engine import Engine, Request
    from engine_helpers import GREEDY, build_prompt, generate_requests

    path = pathlib.Path(__file__).parent / "data" / "vision" / "grad_64x64.png"
    image = (hashlib.sha256(path.read_bytes()).hexdigest(), Image.open(path))
    text = "<|im_start|>user\n<__media__>Describe this image.<|im_end|>\n<|im_start|>assistant\n"
    w = Workers(2, tmp_path)
    runs = {}
    try:
        for name, kw in (("local", {}), ("rpc", {"rpc": tuple(w.endpoints), "n_gpu_layers": 99,
                                                 "tensor_split": (1, 1)})):
            e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_parallel=1, n_threads=1,
                       mmproj=str(mmproj_dir / "mmproj-synth-mlp-f16.gguf"), **kw))
            prompt, spans = build_prompt(e, text, [image])
            events = generate_requests(e, [Request("r", prompt, GREEDY, max_tokens=12, ignore_eos=True,
                                                   images=spans)])["r"]
            runs[name] = [(ev.token, ev.top_logprobs) for ev in events]
            e.close()
    finally:
        w.close()
    assert len(runs["rpc"]) == 12 and runs["rpc"] == runs["local"]


def test_worker_killed_mid_stream_ends_stream_with_error(rpc_server, workers):
    """Runs last: it kills a worker of the module's server."""
    url, proc, _ = rpc_server
    lines = []
    with httpx.stream("POST", url + "/v1/completions", timeout=60, json={
            "prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True, "stream": True,
            "temperature": 0}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
            if len(lines) == 3:
                workers.procs[1].kill()
                workers.procs[1].wait()
    t_end = time.monotonic()
    assert lines[-1] == "[DONE]"              # an ended stream, not a cut one
    last = json.loads(lines[-2])
    assert "error" in last and workers.endpoints[1] in last["error"]["message"], lines[-3:]
    assert len(lines) < 1000                  # ended early, not after 1500 tokens
    assert proc.poll() is None                # the server stays up
    health = httpx.get(url + "/health", timeout=10)
    assert health.status_code == 503
    assert f"RPC worker {workers.endpoints[1]} lost" in health.json()["error"]["message"]
    again = httpx.post(url + "/v1/completions", timeout=10, json={"prompt": "Hi", "max_tokens": 4})
    assert again.status_code == 503 and again.json()["error"]["code"] == "worker_lost"
    assert time.monotonic() - t_end < 20


def test_worker_lost_while_idle_shows_in_health(smollm2_path, tmp_path):
    """An idle server asks its workers every couple of seconds (Service.HEARTBEAT_SECONDS)."""
    w = Workers(2, tmp_path)
    try:
        url, proc = serve_rpc(w, smollm2_path, tmp_path / "serve.log")
        try:
            w.procs[0].kill()
            deadline = time.monotonic() + 15
            while (health := httpx.get(url + "/health", timeout=5)).status_code == 200:
                assert time.monotonic() < deadline, "/health did not notice the lost worker"
                time.sleep(0.2)
            assert health.status_code == 503
            assert f"RPC worker {w.endpoints[0]} lost" in health.json()["error"]["message"]
            proc.terminate()                   # and it still shuts down
            assert proc.wait(20) != 0
        finally:
            stop(proc)
    finally:
        w.close()
