"""GET /openapi.json: an OpenAPI 3.1 document of every endpoint, its request and response
schemas, an example request each (tests/test_openapi.py sends them) and its errors.

Request schemas come from the pydantic models the endpoints validate with where they
have one (chat, completions, llama-server's /completion, /tokenize, /detokenize); the
Responses, Messages, embeddings and slot bodies are written out here."""
from __future__ import annotations

import functools

from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ggserve.server.api import schemas as S
from ggserve.server.api.llama.completion import NativeCompletionRequest

_REF = "#/components/schemas/{model}"
OBJ = {"type": "object"}
CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}


def _obj(required=(), **props) -> dict:
    return {"type": "object", "properties": props, "required": list(required)}


def _ref(name: str) -> dict:
    return {"$ref": _REF.format(model=name)}


_STR, _INT, _NUM, _BOOL = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
_ANY_LIST = {"type": "array"}

# Written-out schemas (request bodies without a pydantic model, and answers).
_SCHEMAS = {
    "Error": _obj(["error"], error=_obj(["message", "type"], message=_STR, type=_STR,
                                        param={"type": ["string", "null"]},
                                        code={"type": ["string", "integer", "null"]})),
    "AnthropicError": _obj(["type", "error"], type={"const": "error"},
                           error=_obj(["type", "message"], type=_STR, message=_STR)),
    "EmbeddingsRequest": _obj(["input"], input={"oneOf": [_STR, {"type": "array"}]}, model=_STR,
                              encoding_format={"enum": ["float", "base64"]}, embd_normalize=_INT),
    "NativeEmbeddingsRequest": _obj([], input={"oneOf": [_STR, {"type": "array"}]},
                                    content={"oneOf": [_STR, {"type": "array"}]}, embd_normalize=_INT),
    "ResponsesRequest": _obj(["input"], input={"oneOf": [_STR, {"type": "array"}]}, model=_STR,
                             instructions=_STR, max_output_tokens=_INT, temperature=_NUM, top_p=_NUM,
                             stream=_BOOL, tools=_ANY_LIST, previous_response_id=_STR, store=_BOOL),
    "MessagesRequest": _obj(["messages", "max_tokens"], model=_STR, messages=_ANY_LIST,
                            max_tokens=_INT, system={"oneOf": [_STR, {"type": "array"}]},
                            stop_sequences={"type": "array", "items": _STR}, tools=_ANY_LIST,
                            stream=_BOOL, temperature=_NUM),
    "CountTokensRequest": _obj(["messages"], model=_STR, messages=_ANY_LIST, system={}, tools=_ANY_LIST),
    "SlotFileRequest": _obj([], filename=_STR),
    "OllamaError": _obj(["error"], error=_STR),
    "OllamaChatRequest": _obj(["model"], model=_STR, messages=_ANY_LIST, tools=_ANY_LIST, format={},
                              options=OBJ, stream=_BOOL, think=_BOOL, keep_alive={"oneOf": [_STR, _NUM]}),
    "OllamaGenerateRequest": _obj(["model"], model=_STR, prompt=_STR, system=_STR, images=_ANY_LIST, raw=_BOOL,
                                  context={"type": "array", "items": _INT}, format={}, options=OBJ, stream=_BOOL,
                                  keep_alive={"oneOf": [_STR, _NUM]}),
    "OllamaDone": _obj(["model", "created_at", "done"], model=_STR, created_at=_STR, done=_BOOL, done_reason=_STR,
                       total_duration=_INT, load_duration=_INT, prompt_eval_count=_INT,
                       prompt_eval_duration=_INT, eval_count=_INT, eval_duration=_INT),
    "InfillRequest": _obj(["input_prefix", "input_suffix"], input_prefix={}, input_suffix={},
                          input_extra={"type": "array", "items": _obj(["text"], text=_STR, filename=_STR)},
                          prompt=_STR, n_predict=_INT, stream=_BOOL, temperature=_NUM),
    "ChatCompletion": _obj(["id", "object", "choices", "usage"], id=_STR, object={"const": "chat.completion"},
                           created=_INT, model=_STR, choices=_ANY_LIST, usage=OBJ, timings=OBJ),
    "Completion": _obj(["id", "object", "choices"], id=_STR, object={"const": "text_completion"},
                       choices=_ANY_LIST, usage=OBJ),
    "NativeCompletion": _obj(["content", "stop", "stop_type", "tokens_predicted", "tokens_evaluated"],
                             index=_INT, content=_STR, tokens={"type": "array", "items": _INT}, stop=_BOOL,
                             stop_type={"enum": ["eos", "limit", "word", "none"]}, stopping_word=_STR,
                             tokens_predicted=_INT, tokens_evaluated=_INT, tokens_cached=_INT,
                             generation_settings=OBJ, timings=OBJ, prompt=_STR, truncated=_BOOL,
                             completion_probabilities=_ANY_LIST),
    "StreamsLookupRequest": _obj(["conversation_ids"], conversation_ids={"type": "array", "items": _STR}),
    "RerankRequest": _obj(["query"], query=_STR, documents={"type": "array", "items": _STR},
                          texts={"type": "array", "items": _STR}, top_n=_INT, return_text=_BOOL, model=_STR),
    "Embeddings": _obj(["object", "data"], object={"const": "list"}, data=_ANY_LIST, usage=OBJ),
    "Models": _obj(["object", "data"], object={"const": "list"}, data=_ANY_LIST),
    "Props": _obj(["default_generation_settings", "total_slots", "chat_template"],
                  default_generation_settings=OBJ, total_slots=_INT, model_path=_STR, chat_template=_STR,
                  modalities=OBJ, build_info=_STR),
    "Response": _obj(["id", "object", "status", "output"], id=_STR, object={"const": "response"},
                     status=_STR, output=_ANY_LIST, usage=OBJ),
    "ToolCall": _obj(["tool"], tool=_STR, params=OBJ, stream=_BOOL),
    "AnthropicMessage": _obj(["id", "type", "role", "content"], id=_STR, type={"const": "message"},
                             role={"const": "assistant"}, content=_ANY_LIST, stop_reason=_STR, usage=OBJ),
}
_MODELS = {"ChatCompletionRequest": S.ChatCompletionRequest, "CompletionRequest": S.CompletionRequest,
           "NativeCompletionRequest": NativeCompletionRequest, "TokenizeRequest": S.TokenizeRequest,
           "DetokenizeRequest": S.DetokenizeRequest}

# (paths, method, summary, request schema, example body, answer: (media type, schema) or None (204), statuses
# it may answer besides 200, params: [(name, in, example)], error schema)
_OPS = [
    (("/health", "/v1/health"), "get", "Ready (200) or loading (503)", None, None,
     ("application/json", _obj(["status"], status=_STR)), (503, 500), [], "Error"),
    (("/v1/models", "/models"), "get", "The served model", None, None, ("application/json", _ref("Models")),
     (), [], "Error"),
    (("/metrics",), "get", "Prometheus metrics (needs --metrics); ggserve_* and llamacpp:*", None, None,
     ("text/plain", _STR), (501,), [], "Error"),
    (("/v1/chat/completions", "/chat/completions"), "post", "OpenAI chat completion; `stream` answers SSE",
     "ChatCompletionRequest", CHAT, ("application/json", _ref("ChatCompletion")), (400, 429, 503), [], "Error"),
    (("/v1/completions",), "post", "OpenAI text completion", "CompletionRequest",
     {"prompt": "The capital of France is", "max_tokens": 4}, ("application/json", _ref("Completion")),
     (400, 429, 503), [], "Error"),
    (("/completion", "/completions"), "post", "llama-server's native completion (a list for several prompts)",
     "NativeCompletionRequest", {"prompt": "The capital of France is", "n_predict": 4},
     ("application/json", _ref("NativeCompletion")), (400, 429, 503), [], "Error"),
    (("/infill",), "post", "llama-server's fill-in-the-middle (501 for a model without FIM tokens)",
     "InfillRequest", {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "n_predict": 4},
     ("application/json", _ref("NativeCompletion")), (400, 501, 503), [], "Error"),
    (("/apply-template",), "post", "A chat request's prompt, rendered, not run", "ChatCompletionRequest", CHAT,
     ("application/json", _obj(["prompt"], prompt=_STR)), (400,), [], "Error"),
    (("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"), "post",
     "How many tokens a chat request's prompt has, not run", "ChatCompletionRequest", CHAT,
     ("application/json", _obj(["input_tokens", "object"], input_tokens=_INT, object=_STR)), (400,), [], "Error"),
    (("/tokenize",), "post", "Text to token ids", "TokenizeRequest", {"content": "Hello world"},
     ("application/json", _obj(["tokens"], tokens=_ANY_LIST)), (400,), [], "Error"),
    (("/detokenize",), "post", "Token ids to text", "DetokenizeRequest", {"tokens": [1, 2, 3]},
     ("application/json", _obj(["content"], content=_STR)), (400,), [], "Error"),
    (("/v1/embeddings",), "post", "OpenAI embeddings (needs --embeddings)", "EmbeddingsRequest",
     {"input": "Hello world"}, ("application/json", _ref("Embeddings")), (400, 501), [], "Error"),
    (("/embeddings", "/embedding"), "post", "llama-server's native embeddings (needs --embeddings)",
     "NativeEmbeddingsRequest", {"content": "Hello world"}, ("application/json", _ANY_LIST), (400, 501), [],
     "Error"),
    (("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"), "post",
     "Documents scored against a query (needs --reranking): Jina's answer for `documents`, TEI's bare list "
     "for `texts`", "RerankRequest", {"query": "Machine learning is", "documents": ["A machine", "Paris"]},
     ("application/json", {"oneOf": [_obj(["object", "results"], object={"const": "list"}, results=_ANY_LIST,
                                          usage=OBJ, model=_STR), _ANY_LIST]}), (400, 501), [], "Error"),
    (("/slots",), "get", "Each slot's state (off with --no-slots)", None, None, ("application/json", _ANY_LIST),
     (501, 503), [], "Error"),
    (("/slots/{id_slot}",), "post", "Save, restore or erase a slot's KV memory (needs --slot-save-path)",
     "SlotFileRequest", {"filename": "slot0.bin"}, ("application/json", OBJ), (400, 501),
     [("id_slot", "path", 0), ("action", "query", "save")], "Error"),
    (("/v1/responses", "/responses"), "post", "OpenAI Responses API; `stream` answers SSE events",
     "ResponsesRequest", {"input": "Say hi", "max_output_tokens": 4}, ("application/json", _ref("Response")),
     (400, 429, 503), [], "Error"),
    (("/v1/responses/input_tokens", "/responses/input_tokens"), "post", "A Responses request's prompt tokens",
     "ResponsesRequest", {"input": "Say hi"}, ("application/json", _obj(["input_tokens"], input_tokens=_INT)),
     (400,), [], "Error"),
    (("/v1/responses/{rid}", "/responses/{rid}"), "get", "A kept response", None, None,
     ("application/json", _ref("Response")), (404,), [("rid", "path", "resp_0")], "Error"),
    (("/v1/responses/{rid}", "/responses/{rid}"), "delete", "Forget a kept response", None, None,
     ("application/json", OBJ), (404,), [("rid", "path", "resp_0")], "Error"),
    (("/v1/messages",), "post", "Anthropic Messages API; `stream` answers SSE events", "MessagesRequest",
     {"max_tokens": 4, "messages": [{"role": "user", "content": "Say hi"}]},
     ("application/json", _ref("AnthropicMessage")), (400, 429, 503), [], "AnthropicError"),
    (("/v1/messages/count_tokens",), "post", "A Messages request's prompt tokens", "CountTokensRequest",
     {"messages": [{"role": "user", "content": "Say hi"}]},
     ("application/json", _obj(["input_tokens"], input_tokens=_INT)), (400,), [], "AnthropicError"),
    (("/props",), "get", "Server properties in llama-server's shape", None, None,
     ("application/json", _ref("Props")), (503,), [], "Error"),
    (("/props",), "post", "Accepted with --props (changes nothing, as llama-server)", None, {},
     ("application/json", _obj(["success"], success=_BOOL)), (501,), [], "Error"),
    (("/lora-adapters",), "get", "The LoRA adapters (--lora): id, path, scale, task_name, prompt_prefix", None,
     None, ("application/json", _ANY_LIST), (503,), [], "Error"),
    (("/lora-adapters",), "post", "The server-wide LoRA scales, [{id, scale}] (an adapter left out: 0)", None,
     [], ("application/json", _obj(["success"], success=_BOOL)), (400,), [], "Error"),
    (("/", "/index.html"), "get", "The chat page (off with --no-webui)", None, None, ("text/html", _STR), (),
     [], "Error"),
    (("/webui/chat.js",), "get", "The chat page's script", None, None, ("text/javascript", _STR), (), [],
     "Error"),
    (("/webui/tools.js",), "get", "The chat page's script for the server's tools", None, None,
     ("text/javascript", _STR), (), [], "Error"),
    (("/webui/chat.css",), "get", "The chat page's style sheet", None, None, ("text/css", _STR), (), [], "Error"),
    (("/v1/stream",), "get", "A stream kept under X-Conversation-Id, replayed from byte `from`, then followed "
     "until it ends", None, None, ("text/event-stream", _STR), (400, 404),
     [("conv_id", "query", "conv-1"), ("from", "query", 0)], "Error"),
    (("/v1/stream",), "delete", "Stop a kept stream: its generation is cancelled (204)", None, None, None, (400,),
     [("conv_id", "query", "conv-1")], "Error"),
    (("/v1/streams/lookup",), "post", "The kept streams of these conversation ids", "StreamsLookupRequest",
     {"conversation_ids": ["conv-1"]}, ("application/json", _ANY_LIST), (400,), [], "Error"),
    (("/tools",), "get", "The chat page's tools, built-in and MCP (needs --tools or MCP servers, else 403)", None,
     None, ("application/json", _ANY_LIST), (403,), [], "Error"),
    (("/tools",), "post", "Run one tool (its failure: 200 with `error`); `stream` answers SSE; headers x-tool-cwd, "
     "x-tool-runtime", "ToolCall", {"tool": "get_info", "params": {}}, ("application/json", OBJ),
     (400, 403, 404, 500), [], "Error"),
    (("/cors-proxy",), "get", "The answer of `url`, fetched by the server (needs --ui-mcp-proxy, else 403)", None,
     None, ("application/json", OBJ), (403, 500), [("url", "query", "http://127.0.0.1:8080/health")], "Error"),
    (("/cors-proxy",), "post", "The answer of `url` to this body (needs --ui-mcp-proxy, else 403)", None, {},
     ("application/json", OBJ), (403, 500), [("url", "query", "http://127.0.0.1:8080/props")], "Error"),
    (("/api/chat",), "post", "Ollama's chat: NDJSON lines unless `stream` is false (docs/serving-many-models.md)",
     "OllamaChatRequest", {"model": "any", "messages": [{"role": "user", "content": "Say hi"}], "stream": False,
                           "options": {"num_predict": 4}},
     ("application/json", _ref("OllamaDone")), (400, 404), [], "OllamaError"),
    (("/api/generate",), "post", "Ollama's generate: a prompt, templated unless `raw`; answers `context`",
     "OllamaGenerateRequest", {"model": "any", "prompt": "Say hi", "stream": False, "options": {"num_predict": 4}},
     ("application/json", _ref("OllamaDone")), (400, 404), [], "OllamaError"),
    (("/api/embed",), "post", "Ollama's embeddings (needs --embeddings)", None, {"model": "any", "input": "Hello"},
     ("application/json", _obj(["embeddings"], model=_STR, embeddings=_ANY_LIST)), (400, 501), [], "OllamaError"),
    (("/api/embeddings",), "post", "Ollama's older embeddings endpoint (needs --embeddings)", None,
     {"model": "any", "prompt": "Hello"}, ("application/json", _obj(["embedding"], embedding=_ANY_LIST)),
     (400, 501), [], "OllamaError"),
    (("/api/show",), "post", "A model's details, GGUF metadata, template and capabilities", None, {"model": "any"},
     ("application/json", _obj(["details", "model_info", "capabilities"], details=OBJ, model_info=OBJ,
                               capabilities=_ANY_LIST)), (404,), [], "OllamaError"),
    (("/api/tags",), "get", "Ollama's list of models", None, None,
     ("application/json", _obj(["models"], models=_ANY_LIST)), (), [], "OllamaError"),
    (("/api/ps",), "get", "Ollama's list of loaded models", None, None,
     ("application/json", _obj(["models"], models=_ANY_LIST)), (), [], "OllamaError"),
    (("/api/version",), "get", "The Ollama API version followed", None, None,
     ("application/json", _obj(["version"], version=_STR)), (), [], "OllamaError"),
    (("/openapi.json",), "get", "This document", None, None, ("application/json", OBJ), (), [], "Error"),
    (("/v1/audio/transcriptions", "/audio/transcriptions"), "post",
     "OpenAI's transcription (multipart form; needs an --mmproj with an audio encoder): `json` (llama-server's "
     "shape), `text`, `verbose_json`, `srt`, `vtt`; `stream` answers transcript.text.* events", None, None,
     ("application/json", _obj(["text"], text=_STR, usage=OBJ)), (400, 503), [], "Error"),
]

# multipart bodies (the table above documents JSON ones); x-ggserve-requires: what the server must load
_FORMS = {"/v1/audio/transcriptions": ("an --mmproj with an audio encoder", _obj(
    ["file"], file={"type": "string", "contentMediaType": "application/octet-stream"}, model=_STR, language=_STR,
    prompt=_STR, response_format={"enum": ["json", "text", "verbose_json", "srt", "vtt"]}, temperature=_STR,
    max_tokens=_STR, stream=_STR))}
_FORMS["/audio/transcriptions"] = _FORMS["/v1/audio/transcriptions"]


def _op_id(method: str, path: str) -> str:
    name = "".join(c if c.isalnum() else "_" for c in path).strip("_") or "root"
    return f"{method}_{name}"


@functools.cache
def document() -> dict:
    _, defs = models_json_schema([(m, "validation") for m in _MODELS.values()], ref_template=_REF)
    schemas = {**defs.get("$defs", {}), **_SCHEMAS}
    paths: dict[str, dict] = {}
    for names, method, summary, body, example, answer, statuses, params, err in _OPS:
        for path in names:
            ok = ({"204": {"description": "No Content"}} if answer is None else
                  {"200": {"description": "OK", "content": {answer[0]: {"schema": answer[1]}}}})
            op: dict = {"operationId": _op_id(method, path), "summary": summary, "responses": ok}
            for status in statuses:
                op["responses"][str(status)] = {"$ref": f"#/components/responses/{err}{status}"}
            op["responses"]["default"] = {"$ref": f"#/components/responses/{err}400"}
            if params:
                op["parameters"] = [{"name": n, "in": where, "required": where == "path",
                                     "schema": _INT if isinstance(ex, int) else _STR, "example": ex}
                                    for n, where, ex in params]
            if body is not None or example is not None:
                content = {"example": example}
                if body is not None:
                    content["schema"] = _ref(body)
                op["requestBody"] = {"required": body is not None, "content": {"application/json": content}}
            if path in _FORMS:
                op["x-ggserve-requires"] = _FORMS[path][0]
                op["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": _FORMS[path][1]}}}
            paths.setdefault(path, {})[method] = op
    responses = {f"{err}{status}": {"description": f"HTTP {status}",
                                    "content": {"application/json": {"schema": _ref(err)}}}
                 for err in ("Error", "AnthropicError", "OllamaError") for status in (400, 403, 404, 429, 500, 501, 503)}
    return {
        "openapi": "3.1.0",
        "info": {"title": "ggserve", "version": "1",
                 "description": "OpenAI-, Anthropic- and llama-server-compatible inference server"},
        "paths": paths,
        "components": {"schemas": schemas, "responses": responses,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                           "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}},
        "security": [{}, {"bearer": []}, {"apiKey": []}],
    }


async def openapi(request: Request) -> Response:
    return JSONResponse(document())
