"""/v1/embeddings in OpenAI's shape; /embeddings and /embedding in llama-server's
native shape. On with --embeddings; the pooling is the server's (--pooling, else
the GGUF's), the normalization the request's `embd_normalize` (default
--embd-normalize, 2: Euclidean), as llama-server. Each input is one engine request
that the scheduler batches with whatever else runs (server/engine/pooling.py).

Inputs, as llama-server reads them: a string, a list of token ids, a list mixing
strings and ids (one input), `{"content": [text parts]}` (OpenAI's content, the texts
joined; no images), or a list of those (one input each). Strings are
tokenized with the model's special tokens (BOS where the GGUF adds it).
"""
from __future__ import annotations

import base64

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ggserve.server.api.common import API
from ggserve.server.api.errors import APIError, invalid
from ggserve.server.chat.prompts import Prompt
from ggserve.server.engine.pooling import normalize
from ggserve.server.engine.sampling.sampler import SamplingParams
from ggserve.server.request_errors import ContextLengthExceeded


async def embeddings_oai(api: API, request: Request) -> Response:
    return await _embeddings(api, request, oai=True)


async def embeddings_native(api: API, request: Request) -> Response:
    return await _embeddings(api, request, oai=False)


async def _embeddings(api: API, request: Request, oai: bool) -> Response:
    if not api.cfg.embeddings:
        raise APIError(501, "This server does not support embeddings. Start it with `--embeddings`")
    engine = api.engine
    if oai and engine.pooling == "none":
        raise invalid("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    body = await api.json_body(request)
    if "input" in body:
        raw = body["input"]
    elif "content" in body:       # llama-server's native field: the native answer
        raw, oai = body["content"], False
    else:
        raise invalid('"input" or "content" must be provided', param="input")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise invalid("encoding_format must be float or base64", param="encoding_format")
    norm = body.get("embd_normalize", api.cfg.embd_normalize)
    if not isinstance(norm, int) or isinstance(norm, bool) or norm < -1:
        raise invalid("embd_normalize must be an integer >= -1 (-1 none, 0 max absolute, "
                      "1 taxicab, 2 Euclidean, > 2 p-norm)", param="embd_normalize")
    dims = body.get("dimensions")
    if dims is not None and dims != engine.model.n_embd:
        raise invalid(f"dimensions: this model's embeddings have {engine.model.n_embd} "
                      "dimensions and cannot be shortened", param="dimensions")
    prompts = tokenize_inputs(engine.tokenizer, raw)
    try:
        vectors = await embed(api.service, prompts)
    except ContextLengthExceeded as e:
        raise invalid(str(e), param="input", code=e.code)
    if engine.pooling != "none":
        vectors = [normalize(v[0], norm)[None, :] for v in vectors]
    if not oai:
        return JSONResponse([{"index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)])
    n_tokens = sum(len(p) for p in prompts)
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v[0].astype("<f4").tobytes()).decode() if fmt == "base64"
             else v[0].tolist()} for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": api.model_id(),
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})


def tokenize_inputs(tok, raw) -> list[list[int]]:
    """The inputs' token ids (llama-server's tokenize_input_prompts)."""
    if isinstance(raw, list) and not any(_is_id(x) for x in raw):
        if not raw:
            raise invalid('"input" must not be empty', param="input")
        prompts = [_one_input(tok, x) for x in raw]
    else:
        prompts = [_one_input(tok, raw)]
    for p in prompts:
        if not p:
            raise invalid("Input content cannot be empty", param="input")
        bad = [t for t in p if not 0 <= t < tok.n_vocab]
        if bad:
            raise invalid(f"input has token id {bad[0]}, out of the vocabulary (0..{tok.n_vocab - 1})",
                          param="input")
    return prompts


def _is_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _one_input(tok, x) -> list[int]:
    """A string, or a list of ids and strings (BOS only where a string comes first)."""
    if isinstance(x, str):
        return tok.encode(x, add_special=True, parse_special=True)
    if isinstance(x, list) and all(_is_id(e) or isinstance(e, str) for e in x):
        ids: list[int] = []
        for i, e in enumerate(x):
            ids += tok.encode(e, add_special=i == 0, parse_special=True) if isinstance(e, str) else [e]
        return ids
    if isinstance(x, dict) and "content" in x:
        return tok.encode(_content_text(x["content"]), add_special=True, parse_special=True)
    if isinstance(x, dict) and "prompt_string" in x and "multimodal_data" not in x:
        return _one_input(tok, x["prompt_string"])
    raise invalid("each input must be a string, a list of token ids, or a list of strings and token ids",
                  param="input")


def _content_text(content) -> str:
    """llama-server's tokenize_oai_content_array: {"content": [parts]}, the text parts joined."""
    if not isinstance(content, list):
        raise invalid('"content" must be an array', param="input")
    for p in content:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in ("image_url", "input_audio", "input_video", "video_url"):
            raise invalid(f"{kind} input is not supported for embeddings by this server", param="input")
        if kind != "text" or not isinstance(p.get("text", ""), str):
            raise invalid("unsupported content[].type", param="input")
    return "".join(p.get("text", "") for p in content)


async def embed(service, prompts: list[list[int]]) -> list:
    """One embedding request per prompt, batched by the engine with all other work:
    each prompt's pooled final hidden states (server/engine/pooling.py Pool.result), in order."""
    out = []
    # a long list of inputs goes in groups that leave room in the queue for others
    group = service.n_parallel + service.max_queue // 2
    for i in range(0, len(prompts), group):
        part = prompts[i:i + group]
        # (sampling parameters go unused by an embedding, but every request has them)
        out += await _vectors(await service.submit([Prompt(p) for p in part], [SamplingParams()] * len(part),
                                                   None, embed=True))
    return out


async def _vectors(job) -> list:
    """The embedding of each of a job's choices, in order."""
    out = [None] * len(job.choices)
    try:
        for _ in job.choices:
            item = await job.queue.get()
            if isinstance(item, BaseException):
                raise item
            index, ev = item
            job.choices[index].engine_done = True
            out[index] = ev.embedding
    finally:
        job.close()
    return out
