"""llama-server's memory at its defaults, from its load log: tests/test_resident_memory.py.

    python tests/data/resident_memory/make_reference.py LLAMA_SERVER

For each model of bench/memory.py (Gemma 3 270M, SmolLM2-135M, the synthetic qwen3moe)
llama-server starts with only `-m`, `--port`, `-t 1` and `-v` (so `-c 0`, `-np` auto,
`--fit` on, as bench/memory.py starts it), and the lines of its load log after the fit
(the real allocation: the last of each) give the compute buffer and the KV cache, MiB.
"""
import json
import os
import re
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
import memory  # bench/memory.py: where the models are

HERE = os.path.dirname(os.path.abspath(__file__))


def load_log(server: str, model: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "-m", model, "--port", str(port), "-t", "1", "-v"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            lines.append(line)
            if "listening on" in line or time.monotonic() > deadline:
                break
    finally:
        proc.terminate()
        proc.wait(30)
    return "".join(lines)


def main() -> None:
    out = {"llama_server": "11434", "command": "llama-server -m MODEL --port PORT -t 1 -v", "models": {}}
    for name in ("gemma3", "smollm2", "moe"):
        log = load_log(sys.argv[1], str(memory.model_path(name)))
        compute = re.findall(r"CPU compute buffer size = +([\d.]+) MiB", log)[-1]
        kv = re.findall(r"llama_kv_cache: size = +([\d.]+) MiB", log)
        n_ctx = re.findall(r"llama_context: n_ctx += (\d+)", log)[-1]
        # the fit's dry run logs every cache once more before the real one: the real ones are the last half
        out["models"][name] = {"n_ctx": int(n_ctx), "compute_mib": float(compute),
                               "kv_mib": [float(x) for x in kv[len(kv) // 2:]]}
    with open(os.path.join(HERE, "llama_server_11434.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
