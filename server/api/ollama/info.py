"""Ollama's model endpoints: /api/tags, /api/show, /api/ps, /api/version, /api/embed,
/api/embeddings; and what /api/pull, /api/push, /api/create, /api/copy, /api/delete answer
in router mode (server/router/ollama.py): what to do instead, since ggserve serves the GGUF
files it is given and downloads nothing."""
from __future__ import annotations

import datetime
import os
import time

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ggserve.native.gguf_file import GGUFFile
from ggserve.server.api.common import API
from ggserve.server.api.errors import APIError, invalid
from ggserve.server.api.ollama.convert import ns
from ggserve.server.api.openai.embeddings import embed as embed_prompts, tokenize_inputs
from ggserve.server.engine.pooling import normalize

VERSION = "0.6.3"            # the Ollama API version these endpoints follow (clients check it)
# llama.cpp's llama_ftype names (general.file_type)
_FTYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
           12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
           19: "IQ2_XXS", 20: "IQ2_XS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 28: "IQ4_XS", 32: "BF16",
           36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4"}
_INSTEAD = {"pull": "place the GGUF file in --models-dir (or name it in --models-preset)",
            "push": "share the GGUF file itself", "create": "write a --models-preset section (model =, flags)",
            "copy": "add a --models-preset section naming the same file",
            "delete": "remove the file from --models-dir"}


def parameter_count(gguf) -> int:
    return int(sum(np.prod([d for d in t.ne if d > 0], dtype=np.int64) for t in gguf.tensors.values()))


def size_label(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def details(gguf) -> dict:
    arch = gguf.architecture or ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
            "parameter_size": size_label(parameter_count(gguf)),
            "quantization_level": _FTYPES.get(gguf.get("general.file_type"), "unknown")}


def model_info(gguf) -> dict:
    """The GGUF's metadata, long arrays (the vocabulary) left out as Ollama leaves them out."""
    out = {}
    for k, v in gguf.metadata.items():
        if isinstance(v, (list, np.ndarray)) and len(v) > 64:
            continue
        out[k] = v.tolist() if isinstance(v, np.ndarray) else v
    out["general.parameter_count"] = parameter_count(gguf)
    return out


def capabilities(gguf, mmproj: str | None, embeddings: bool) -> list[str]:
    template = gguf.get("tokenizer.chat_template") or ""
    caps = ["completion"]
    if mmproj:
        caps.append("vision")
    if "tools" in template:
        caps.append("tools")
    if "<think>" in template or "enable_thinking" in template or "reasoning" in template:
        caps.append("thinking")
    if embeddings:
        caps.append("embedding")
    if gguf.get("tokenizer.ggml.fim_pre_token_id") is not None:
        caps.append("insert")
    return caps


def tag_entry(name: str, path: str, gguf) -> dict:
    stat = os.stat(path)
    modified = datetime.datetime.fromtimestamp(stat.st_mtime, datetime.timezone.utc).isoformat()
    return {"name": name, "model": name, "modified_at": modified, "size": stat.st_size,
            "digest": f"{stat.st_ino:x}{int(stat.st_mtime):x}", "details": details(gguf)}


def show_answer(gguf, path: str, mmproj: str | None, embeddings: bool, verbose: bool = False) -> dict:
    # verbose: the whole header, read again (a loaded model's metadata no longer holds the merges)
    info = model_info(gguf) if not verbose else {
        k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in GGUFFile(gguf.path).metadata.items()}
    return {"license": gguf.get("general.license", ""), "modelfile": f"FROM {path}\n", "parameters": "",
            "template": gguf.get("tokenizer.chat_template") or "", "details": details(gguf),
            "model_info": info, "capabilities": capabilities(gguf, mmproj, embeddings),
            "modified_at": datetime.datetime.fromtimestamp(os.stat(path).st_mtime, datetime.timezone.utc).isoformat()}


# -- one model's server ------------------------------------------------------------------

def _gguf(api: API):
    return api.engine.loaded.gguf


async def tags(api: API, request: Request) -> Response:
    return JSONResponse({"models": [tag_entry(api.model_id(), api.cfg.model, _gguf(api))]})


async def show(api: API, request: Request) -> Response:
    body = await api.json_body(request)
    return JSONResponse(show_answer(_gguf(api), api.cfg.model, api.cfg.mmproj, bool(api.cfg.embeddings),
                                    bool(body.get("verbose"))))


async def ps(api: API, request: Request) -> Response:
    entry = tag_entry(api.model_id(), api.cfg.model, _gguf(api))
    entry.update(expires_at="0001-01-01T00:00:00Z", size_vram=0, context_length=api.engine.n_ctx)
    return JSONResponse({"models": [entry] if api.service.ready else []})


async def version(api: API, request: Request) -> Response:
    return JSONResponse({"version": VERSION})


async def embed(api: API, request: Request) -> Response:
    """/api/embed: `input` (a string or a list), L2-normalized vectors as Ollama gives them."""
    return await _embed(api, request, legacy=False)


async def embeddings(api: API, request: Request) -> Response:
    """/api/embeddings (Ollama's older endpoint): one `prompt`, its vector as the model pools it."""
    return await _embed(api, request, legacy=True)


async def _embed(api: API, request: Request, legacy: bool) -> Response:
    if not api.cfg.embeddings:
        raise APIError(501, "this server does not compute embeddings: start it with --embeddings")
    body, t0 = await api.json_body(request), time.perf_counter()
    raw = body.get("prompt") if legacy else body.get("input")
    if raw is None or (legacy and not isinstance(raw, str)):
        raise invalid("prompt: a string" if legacy else "input: a string or a list of strings",
                      param="prompt" if legacy else "input")
    engine = api.engine
    prompts = tokenize_inputs(engine.tokenizer, raw)
    vectors = [v[0] for v in await embed_prompts(api.service, prompts)]
    if legacy:
        return JSONResponse({"embedding": vectors[0].tolist()})
    vectors = [normalize(v, 2) for v in vectors]
    return JSONResponse({"model": body.get("model") or api.model_id(), "embeddings": [v.tolist() for v in vectors],
                         "total_duration": ns(time.perf_counter() - t0), "load_duration": 0,
                         "prompt_eval_count": sum(len(p) for p in prompts)})


def routes(api: API, route) -> list:
    """Ollama's endpoints on one model's server, errors in Ollama's shape."""
    import functools

    from ggserve.server.api.ollama import generate as gen
    from ggserve.server.api.ollama.convert import error_response

    out = []
    for path, fn, methods in (("/api/chat", gen.chat, ["POST"]), ("/api/generate", gen.generate, ["POST"]),
                              ("/api/embed", embed, ["POST"]), ("/api/embeddings", embeddings, ["POST"]),
                              ("/api/tags", tags, ["GET"]), ("/api/show", show, ["POST"]),
                              ("/api/ps", ps, ["GET"]), ("/api/version", version, ["GET"])):
        out.append(route(path, functools.partial(fn, api), methods, "ollama", errors=error_response))
    return out         # the model-store endpoints (pull, ...) are the router's (server/router/ollama.py)
