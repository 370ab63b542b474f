"""Decode speed with a JSON schema against without, at 1 and 8 streams; with
--llama-server PATH the same requests go to llama-server on the same model.

    python bench/structured.py [--model M.gguf] [--llama-server PATH] [--order ABBA]

Each request asks for 128 tokens at temperature 0: unconstrained with ignore_eos,
or a list of at least 40 strings (a schema that cannot end before 128 tokens); the figure is generated tokens per
second over all streams (wall time from first request sent to last answer). The
servers run with the same threads, slots and context. Writes bench/structured.json.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import socket
import subprocess
import sys
import time

import httpx

# at least 40 notes: the schema cannot be complete before the 128 tokens are out
SCHEMA = {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}, "minItems": 40}},
          "required": ["notes"]}
N_TOKENS = 128


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], url: str) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{cmd[0]} did not start")


def run(url: str, streams: int, schema: bool) -> float:
    body = {"messages": [{"role": "user", "content": "Write notes about the history of Paris."}],
            "max_tokens": N_TOKENS, "temperature": 0}
    if not schema:
        body["ignore_eos"] = True
    else:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "notes", "schema": SCHEMA}}

    def one(i):
        b = dict(body, messages=[{"role": "user", "content": f"Write notes about the history of Paris ({i})."}])
        r = httpx.post(url + "/v1/chat/completions", json=b, timeout=600)
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"]

    one(-1)                                   # warm up
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(streams) as ex:
        n = sum(ex.map(one, range(streams)))
    return n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--llama-server")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--order", default="ABBA", help="A: ggserve, B: llama-server, in this order")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from ggserve.server.cli.main import default_model
    model = args.model or default_model()
    common = ["-m", model, "-c", "4096", "-np", "8", "-t", str(args.threads)]
    print(f"threads {args.threads}, order {args.order}", flush=True)
    servers = {"A": ("ggserve", [os.path.join(os.path.dirname(sys.executable), "ggserve"), "serve", *common])}
    if args.llama_server:
        servers["B"] = ("llama-server", [args.llama_server, "--jinja", *common])
    results: dict[str, list] = {}
    for key in args.order:
        if key not in servers:
            continue
        name, cmd = servers[key]
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start(cmd + ["--port", str(port)], url)
        try:
            for streams in (1, 8):
                for schema in (False, True):
                    tps = run(url, streams, schema)
                    results.setdefault(name, []).append(
                        {"streams": streams, "schema": schema, "tokens_per_s": round(tps, 2)})
                    print(f"{name:12s} streams={streams} schema={schema!s:5s} {tps:8.2f} tok/s", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    with open(os.path.join(os.path.dirname(__file__), "structured.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
