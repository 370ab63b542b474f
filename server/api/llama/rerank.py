"""/rerank (also /reranking, /v1/rerank, /v1/reranking): documents scored against a
query, as llama-server serves them with --reranking (embeddings on, pooling rank).

Two request shapes, as llama-server reads them: Jina's (`documents`; answered
`{model, object, usage, results: [{index, relevance_score}]}`) and Hugging Face TEI's
(`texts`; answered with the bare list `[{index, score}]`, `text` too when
`return_text`). Results are sorted by score, best first, and cut to `top_n`.

Each document is one embedding request (server/api/openai/embeddings.py embed), so the
scheduler batches them with whatever else runs; its score is the rank-pooled row's
first element (server/engine/pooling.py rank_score).
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ggserve.server.api.common import API
from ggserve.server.api.errors import APIError, invalid
from ggserve.server.api.openai.embeddings import embed
from ggserve.server.engine.pooling import rank_score
from ggserve.server.request_errors import ContextLengthExceeded


async def rerank(api: API, request: Request) -> Response:
    engine = api.engine
    if engine.pooling != "rank":
        raise APIError(501, "This server does not support reranking. Start it with `--reranking`")
    body = await api.json_body(request)
    tei = "texts" in body
    if "query" not in body:
        raise invalid('"query" must be provided', param="query")
    query = body["query"]
    if not isinstance(query, str):
        raise invalid('"query" must be a string', param="query")
    docs = body.get("documents", body.get("texts"))
    if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
        raise invalid('"documents" must be a non-empty string array', param="documents")
    top_n = body.get("top_n", len(docs))
    if not isinstance(top_n, int) or isinstance(top_n, bool):
        raise invalid('"top_n" must be an integer', param="top_n")
    prompts = [rerank_prompt(engine, query, d) for d in docs]
    try:
        pooled = await embed(api.service, prompts)
    except ContextLengthExceeded as e:
        raise invalid(str(e), param="documents", code=e.code)
    label = "score" if tei else "relevance_score"
    results = [{"index": i, label: rank_score(v)} for i, v in enumerate(pooled)]
    if tei and body.get("return_text") is True:
        for r in results:
            r["text"] = docs[r["index"]]
    results.sort(key=lambda r: -r[label])        # stable: equal scores keep the documents' order
    results = results[:max(top_n, 0)]
    if tei:
        return JSONResponse(results)
    n_tokens = sum(len(p) for p in prompts)
    return JSONResponse({"model": body.get("model", api.model_id()), "object": "list",
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
                         "results": results})


def rerank_prompt(engine, query: str, doc: str) -> list[int]:
    """llama-server's format_prompt_rerank: the GGUF's `tokenizer.chat_template.rerank`
    with {query} and {document} filled in (special tokens parsed), else
    [BOS] query [EOS] [SEP] doc [EOS], each marker where the vocabulary adds it."""
    tok = engine.tokenizer
    template = engine.loaded.gguf.metadata.get("tokenizer.chat_template.rerank")
    if isinstance(template, str):
        text = template.replace("{query}", query).replace("{document}", doc)
        return tok.encode(text, add_special=False, parse_special=True)
    v = tok.vocab
    eos = v.eos if v.eos >= 0 else v.sep
    ids = [v.bos] if v.add_bos else []
    ids += tok.encode(query, add_special=False)
    ids += [eos] if v.add_eos else []
    ids += [v.sep] if v.add_sep else []
    ids += tok.encode(doc, add_special=False)
    ids += [eos] if v.add_eos else []
    return ids
