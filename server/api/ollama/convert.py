"""Ollama's request fields -> ggserve's: options -> sampling fields, `format` -> a JSON
schema, messages -> chat messages, `keep_alive` -> seconds, names -> model ids."""
from __future__ import annotations

import base64
import datetime
import json
import re

from starlette.responses import JSONResponse

from ggserve.server.api.errors import APIError, invalid

# Ollama's options with the same meaning under llama-server's names
_SAME = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n",
         "presence_penalty", "frequency_penalty", "seed")
# options that size or place the model: fixed when it loads (ggserve serve's flags), accepted here
_LOAD_TIME = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread", "numa", "low_vram",
              "num_keep", "penalize_newline", "tfs_z", "mirostat", "mirostat_tau", "mirostat_eta")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def error_response(err: APIError) -> JSONResponse:
    """Ollama's error shape: {"error": "message"} with the status."""
    return JSONResponse({"error": err.message}, status_code=err.status, headers=err.headers)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def ns(seconds: float) -> int:
    return int(seconds * 1e9)


def keep_alive_seconds(value) -> float | None:
    """keep_alive: a number of seconds or a Go duration ("5m", "1h30m", "0"); negative: forever (None)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise invalid("keep_alive: a duration such as \"5m\" or a number of seconds", param="keep_alive")
    if isinstance(value, (int, float)):
        return None if value < 0 else float(value)
    text = str(value).strip()
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return None if float(text) < 0 else float(text)
    if text.startswith("-"):
        return None
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise invalid(f"keep_alive: {value!r} is not a duration (e.g. \"5m\", \"30s\", \"0\", -1)",
                      param="keep_alive")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def sampling_fields(body: dict) -> dict:
    """`options` (and `format`) -> the fields of a ggserve chat or completion request."""
    opts = body.get("options") or {}
    if not isinstance(opts, dict):
        raise invalid("options: must be an object", param="options")
    out = {k: opts[k] for k in _SAME if opts.get(k) is not None}
    if opts.get("num_predict") is not None:
        n = opts["num_predict"]
        if not isinstance(n, int) or isinstance(n, bool) or n < -2:
            raise invalid("options.num_predict: an integer >= -2", param="options.num_predict")
        if n >= 0:
            out["max_tokens"] = n
    if opts.get("stop") is not None:
        out["stop"] = [opts["stop"]] if isinstance(opts["stop"], str) else opts["stop"]
    unknown = sorted(k for k in opts if k not in _SAME and k not in _LOAD_TIME and k not in ("num_predict", "stop"))
    if unknown:
        raise invalid(f"options.{unknown[0]}: not an Ollama option this server knows", param=f"options.{unknown[0]}")
    schema = format_schema(body.get("format"))
    if schema is not None:
        out["json_schema"] = schema
    return out


def format_schema(fmt) -> dict | None:
    """format: "json" (any JSON object) or a JSON schema -> the schema decoding follows."""
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return {"type": "object"}
    if isinstance(fmt, dict):
        return fmt
    raise invalid('format: "json" or a JSON schema object', param="format")


def image_part(data, where: str) -> dict:
    """An Ollama image (base64, no data: prefix) -> an OpenAI image_url part."""
    if not isinstance(data, str):
        raise invalid(f"{where}: images are base64 strings", param=where)
    try:
        head = base64.b64decode(data[:64] + "=" * (-len(data[:64]) % 4), validate=False)[:12]
    except ValueError:
        raise invalid(f"{where}: not base64", param=where) from None
    mime = ("image/png" if head.startswith(b"\x89PNG") else "image/gif" if head.startswith(b"GIF8")
            else "image/webp" if head[8:12] == b"WEBP" else "image/jpeg")
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}


def chat_messages(messages) -> list[dict]:
    """Ollama messages (content, images, tool_calls with object arguments, thinking, tool
    results) -> chat messages."""
    if not isinstance(messages, list):
        raise invalid("messages: must be a list", param="messages")
    out, call_ids = [], []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise invalid(f"messages.{i}.role: system, user, assistant or tool", param=f"messages.{i}.role")
        msg: dict = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("images"):
            parts = [image_part(x, f"messages.{i}.images.{j}") for j, x in enumerate(m["images"])]
            msg["content"] = ([{"type": "text", "text": msg["content"]}] if msg["content"] else []) + parts
        if m.get("thinking"):
            msg["reasoning_content"] = m["thinking"]
        if m.get("tool_calls"):
            msg["tool_calls"] = [_openai_call(c, f"call_{len(call_ids) + k}") for k, c in enumerate(m["tool_calls"])]
            call_ids += [c["id"] for c in msg["tool_calls"]]
        if m["role"] == "tool":
            msg["tool_call_id"] = call_ids.pop(0) if call_ids else "call_0"
            if m.get("tool_name"):
                msg["name"] = m["tool_name"]
        out.append(msg)
    return out


def _openai_call(call: dict, cid: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise invalid("tool_calls: each needs function.name", param="tool_calls")
    args = fn.get("arguments") or {}
    return {"id": cid, "type": "function",
            "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}}


def ollama_calls(calls: list[dict]) -> list[dict]:
    """OpenAI tool calls -> Ollama's (arguments as an object)."""
    out = []
    for i, c in enumerate(calls):
        fn = c.get("function", {})
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = fn.get("arguments")
        out.append({"function": {"index": i, "name": fn.get("name"), "arguments": args}})
    return out


def model_id(name: str, ids) -> str | None:
    """An Ollama name (`name:tag`, `:latest` implied) -> the router's id, if it names one."""
    if name in ids:
        return name
    base, _, tag = name.rpartition(":")
    if tag == "latest" and base in ids:
        return base
    return next((i for i in ids if i.lower() == name.lower() or f"{i}:latest".lower() == name.lower()), None)
