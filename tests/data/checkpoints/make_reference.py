"""Record which context checkpoints llama-server 11434 makes and erases in a 4-turn chat, at
three --checkpoint-min-step values, for tests/test_checkpoint_spacing.py (README.md here).

usage: python make_reference.py LLAMA_SERVER
Starts llama-server on the synthetic Qwen3.5 (../../../../shared/golden/synth/models) with
`-t 1 -c 4096 -np 1 --ctx-checkpoints 4 -lv 4` and each `-cms`, sends the turns of
../swa_memory/make_reference.py (each the conversation so far, its earlier answers included),
and writes checkpoints.json next to this file: per turn the prompt's size, the cached tokens,
the n_tokens of each checkpoint created and erased (the log's SLT_TRC/SLT_WRN lines, in order)
and the n_tokens the slot holds after it.
"""
import importlib.util
import json
import pathlib
import re
import sys
import time

import httpx

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from llama_server_run import llama_server_process


def _swa_memory_turns() -> list[str]:
    """The 4-turn conversation of ../swa_memory/make_reference.py (loaded by path: both are make_reference)."""
    spec = importlib.util.spec_from_file_location("swa_memory_reference", HERE.parent / "swa_memory" / "make_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TURNS


SYNTH = HERE.parents[3] / "shared" / "golden" / "synth" / "models"
PORT = 18473
URL = f"http://127.0.0.1:{PORT}"
TURNS = _swa_memory_turns()
ARGS = ["-t", "1", "-c", "4096", "-np", "1", "--ctx-checkpoints", "4", "-lv", "4"]
EVENT = re.compile(r"(created context checkpoint|erasing context checkpoint too close|erasing old context checkpoint|"
                   r"superseding context checkpoint).*?n_tokens = (\d+)")
KIND = {"created context checkpoint": "created", "erasing context checkpoint too close": "erased_close",
        "erasing old context checkpoint": "erased_old", "superseding context checkpoint": "superseded"}


def events(text: str) -> list[list]:
    return [[KIND[m.group(1)], int(m.group(2))] for m in EVENT.finditer(text)]


def run(binary: str, min_step: int) -> dict:
    log = HERE / "_server.log"
    cmd = [binary, "-m", str(next(SYNTH.glob("synth-qwen35-*.gguf"))), "--port", str(PORT), *ARGS, "-cms", str(min_step)]
    try:
        with open(log, "w") as server_log, llama_server_process(cmd, URL, stderr=server_log):
            messages, turns, held, seen = [], [], [], 0
            for text in TURNS:
                messages.append({"role": "user", "content": text})
                r = httpx.post(URL + "/v1/chat/completions", json={"messages": messages, "max_tokens": 8,
                                                                   "temperature": 0}, timeout=600).json()
                time.sleep(0.5)
                new = events(log.read_text())[seen:]
                seen += len(new)
                for kind, n in new:
                    if kind == "created":
                        held.append(n)
                    else:
                        held.remove(n)
                turns.append({"prompt_tokens": r["usage"]["prompt_tokens"],
                              "cached_tokens": r["usage"]["prompt_tokens_details"]["cached_tokens"],
                              "events": new, "held": list(held)})
                messages.append({"role": "assistant", "content": r["choices"][0]["message"].get("content") or ""})
        return {"args": [*ARGS, "-cms", str(min_step)], "messages": messages, "turns": turns}
    finally:
        log.unlink(missing_ok=True)


def main() -> None:
    binary = sys.argv[1]
    out = {"llama_server": "11434", "runs": {str(m): run(binary, m) for m in (8192, 100, 0)}}
    (HERE / "checkpoints.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
