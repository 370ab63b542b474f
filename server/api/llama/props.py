"""llama-server's /props: GET answers what a client needs to know about the server in
llama-server's shape (tools/server/server-context.cpp get_res_props); POST is refused
(501) unless the server runs with --props, and then changes nothing ({"success": true}),
as llama-server 11434 does."""
from __future__ import annotations

import os

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ggserve.models.chat_template import IMAGE_MARKER
from ggserve.server.api.errors import APIError
from ggserve.server.api.llama.completion import NativeCompletionRequest, generation_settings

# generation_settings' fields that /props' default_generation_settings.params leaves out
_NOT_IN_PROPS = {"stop", "logit_bias", "grammar", "grammar_lazy", "grammar_triggers",
                 "preserved_tokens", "dry_sequence_breakers"}
# llama.cpp's llama_ftype_name for general.file_type (include/llama.h's enum)
_FTYPES = {0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
           10: "Q2_K - Medium", 11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large",
           14: "Q4_K - Small", 15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium",
           18: "Q6_K", 19: "IQ2_XXS - 2.0625 bpw", 20: "IQ2_XS - 2.3125 bpw", 21: "Q2_K - Small",
           22: "IQ3_XS - 3.3 bpw", 23: "IQ3_XXS - 3.0625 bpw", 24: "IQ1_S - 1.5625 bpw",
           25: "IQ4_NL - 4.5 bpw", 26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw",
           28: "IQ2_S - 2.5 bpw", 29: "IQ2_M - 2.7 bpw", 30: "IQ4_XS - 4.25 bpw", 31: "IQ1_M - 1.75 bpw",
           32: "BF16", 36: "TQ1_0 - 1.69 bpw ternary", 37: "TQ2_0 - 2.06 bpw ternary", 38: "MXFP4 MoE"}


def template_caps(template) -> dict[str, bool]:
    """llama.cpp's chat_template_caps, found by rendering marked probes (llama.cpp watches
    which variables the template reads; a template that reads a value prints it)."""
    def shows(marker: str, messages, tools=None) -> bool:
        try:
            return marker in template.render(messages, add_generation_prompt=False, tools=tools)
        except Exception:
            return False

    def call(name: str, args) -> dict:
        return {"id": name, "type": "function", "function": {"name": name, "arguments": args}}

    def calls(*cs) -> list:
        return [{"role": "user", "content": "u"}, {"role": "assistant", "content": "", "tool_calls": list(cs)},
                {"role": "tool", "content": "r", "tool_call_id": cs[0]["id"]}, {"role": "user", "content": "u"}]

    tool = [{"type": "function", "function": {"name": "TOOL_MARK", "description": "d",
             "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}}}}]
    user = [{"role": "user", "content": "u"}]
    obj = shows("ARG_MARK", calls(call("CALL_A", {"arg": "ARG_MARK"})), tool)
    found = {
        "supports_object_arguments": obj,
        "supports_parallel_tool_calls": shows("CALL_B", calls(call("CALL_A", {"arg": "x"}),
                                                              call("CALL_B", {"arg": "y"})), tool),
        "supports_preserve_reasoning": shows("WHY_MARK", user + [
            {"role": "assistant", "content": "a", "reasoning_content": "WHY_MARK"}] + user),
        "supports_reasoning_effort": "reasoning_effort" in template.source,
        "supports_string_content": shows("TEXT_MARK", [{"role": "user", "content": "TEXT_MARK"}]),
        "supports_system_role": shows("SYS_MARK", [{"role": "system", "content": "SYS_MARK"}] + user),
        "supports_tool_calls": obj or shows("CALL_A", calls(call("CALL_A", '{"arg": "x"}')), tool),
        "supports_tools": shows("TOOL_MARK", user, tool),
        "supports_typed_content": bool(template.supports_typed_content),
    }
    caps = getattr(template, "caps", None)
    if caps is not None:    # found as llama.cpp's jinja finds them (models/template_caps.py)
        found.update(supports_object_arguments=caps.object_arguments, supports_system_role=caps.system_role,
                     supports_tool_calls=caps.tool_calls, supports_tools=caps.tools,
                     supports_string_content=bool(template.supports_string_content))
    return found


def props(api) -> dict:
    engine = api.engine  # 503 while loading, 500 if loading failed
    cfg = api.cfg
    tok = engine.tokenizer
    meta = engine.loaded.gguf.metadata if getattr(engine, "loaded", None) else {}
    defaults = NativeCompletionRequest(prompt="")
    params = {k: v for k, v in generation_settings(api, defaults, api.sampling(defaults, 0, 1)[0]).items()
              if k not in _NOT_IN_PROPS}
    ftype = meta.get("general.file_type")
    return {
        "default_generation_settings": {"params": params, "n_ctx": engine.n_ctx},
        "total_slots": cfg.n_parallel,
        "model_alias": api.model_id(),
        "model_ftype": _FTYPES.get(ftype, "unknown, may not work") if ftype is not None else "",
        "model_path": os.fspath(cfg.model),
        "modalities": {"vision": engine.vision is not None, "video": False,
                       "audio": engine.loaded.audio is not None},
        "media_marker": IMAGE_MARKER,
        "endpoint_slots": cfg.slots_endpoint,
        "endpoint_props": cfg.props_endpoint,
        "endpoint_metrics": cfg.metrics,
        "ui": cfg.webui,
        "ui_settings": {},
        "chat_template": engine.chat_template.source,
        "chat_template_caps": template_caps(engine.chat_template),
        "bos_token": tok.id_to_token(tok.bos_id) if tok.bos_id is not None and tok.bos_id >= 0 else "",
        "eos_token": tok.id_to_token(tok.eos_id) if tok.eos_id is not None and tok.eos_id >= 0 else "",
        "build_info": "ggserve",
        "is_sleeping": False,
        "cors_proxy_enabled": bool(getattr(getattr(cfg, "agent", None), "cors_proxy", False)),   # --ui-mcp-proxy
    }


def routes(api, route) -> list:
    async def get(request: Request) -> Response:
        if api.sleeper is not None and api.sleeper.sleeping:
            return JSONResponse(api.sleeper.props)      # taken as the server fell asleep
        return JSONResponse(props(api))

    async def post(request: Request) -> Response:
        if not api.cfg.props_endpoint:
            raise APIError(501, "This server does not support changing global properties. "
                                "Start it with `--props`")
        await api.json_body(request)
        return JSONResponse({"success": True})

    return [route("/props", get, ["GET"], "props"), route("/props", post, ["POST"], "props")]
