"""Record llama-server's context shift on the synthetic golden models (see README.md here).

usage: python make_shift_synth.py LLAMA_SERVER [ARCH ...]
For each architecture (default: one of each kind: qwen3 plain, deepseek2 MLA, cohere2
sliding-window ring with unroped global layers, granitehybrid hybrid), llama-server
11434 with `-t 2 -c 256 -np 1 --context-shift` and the golden's greedy settings answers
the golden's first prompt with 400 tokens (`ignore_eos`), the top two logprobs of each
step beside them; writes context_shift_synth.json.
A server that dies on the request (granitehybrid: llama.cpp aborts in its K-shift) is
recorded as such, with its answer without --context-shift beside it.
"""
import json
import pathlib
import subprocess
import sys

import httpx

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
from llama_server_run import llama_server_process

HERE = pathlib.Path(__file__).parent
SYNTH = HERE.parents[3] / "shared" / "golden" / "synth"
ARGS = ["-t", "2", "-c", "256", "-np", "1", "--context-shift"]
GREEDY = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0,
          "n_predict": 400, "ignore_eos": True, "return_tokens": True, "cache_prompt": False,
          "n_probs": 2, "post_sampling_probs": False}


def record(binary: str, arch: str, prompt_ids: list[int], args=ARGS, port: int = 18433) -> dict:
    model = next((SYNTH / "models").glob(f"synth-{arch}-*.gguf"))
    url = f"http://127.0.0.1:{port}"
    with llama_server_process([binary, "-m", str(model), "--port", str(port), *args], url,
                              stderr=subprocess.PIPE) as proc:
        try:
            r = httpx.post(url + "/completion", json={"prompt": prompt_ids, **GREEDY}, timeout=600).json()
        except httpx.RemoteProtocolError:       # the server died
            proc.wait(timeout=30)
            died = [line for line in proc.stderr.read().splitlines() if "GGML_ASSERT" in line or " in " in line]
            return {"model": model.name, "llama_server_args": args, "prompt_ids": prompt_ids, "aborted": died[:6]}
    # the top two logprobs of each step (a near tie lets an implementation choose either)
    top2 = [[[t["id"], t["logprob"]] for t in p["top_logprobs"]] for p in r["completion_probabilities"]]
    return {"model": model.name, "llama_server_args": args, "prompt_ids": prompt_ids,
            "generated_ids": r["tokens"], "truncated": r["truncated"], "stop_type": r["stop_type"], "top2": top2}


def main(binary: str, archs: list[str]) -> None:
    golden = json.loads((SYNTH / "out" / "synth_completions.json").read_text())["models"]
    out = {}
    for arch in archs:
        out[arch] = record(binary, arch, golden[arch][0]["prompt_ids"])
        if "aborted" in out[arch]:
            out[arch]["without_context_shift"] = record(binary, arch, golden[arch][0]["prompt_ids"], ARGS[:-1])
    path = HERE / "context_shift_synth.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print({a: (len(v.get("generated_ids", [])), v.get("truncated"), "aborted" in v) for a, v in out.items()})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["qwen3", "deepseek2", "cohere2", "granitehybrid"])
