"""llama-server's /infill: fill-in-the-middle with the FIM tokens of the GGUF, laid out as
its format_prompt_infill (tools/server/server-common.cpp) lays them out:

    [FIM_REP]myproject\\n [FIM_SEP]file\\n chunk ... [FIM_SEP]filename\\n
    [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]

(the extra context keeps its last n_ctx - n_batch - 2 * n_predict(-1) tokens; the prefix its
last 3/4 of a batch, the suffix what fits in the batch's last quarter). The answer is
/completion's (server/api/llama/completion.py)."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ggserve.server.api.common import API
from ggserve.server.api.errors import APIError, invalid
from ggserve.server.api.llama.completion import NativeCompletionRequest, answer, text_logit_bias, tokenize_mixed

# llama-server's separator between extra chunks when the vocabulary has no FIM_SEP
_CHUNK_SEP = "\n\n--- snippet ---\n\n"


def fim_tokens(vocab) -> dict[str, int]:
    missing = [f"{name} token is missing. " for name, t in
               (("prefix", vocab.fim_pre), ("suffix", vocab.fim_suf), ("middle", vocab.fim_mid)) if t < 0]
    if missing:
        raise APIError(501, "Infill is not supported by this model: " + "".join(missing))
    return {"pre": vocab.fim_pre, "suf": vocab.fim_suf, "mid": vocab.fim_mid,
            "rep": vocab.fim_rep, "sep": vocab.fim_sep}


def infill_prompt(tok, req: NativeCompletionRequest, n_ctx: int, n_batch: int) -> list[int]:
    fim = fim_tokens(tok.vocab)
    vocab = tok.vocab

    def text(s: str) -> list[int]:
        return tok.encode(s, add_special=False, parse_special=False)

    prefix = _mixed(tok, req.input_prefix)
    suffix = _mixed(tok, req.input_suffix)
    prompt = tok.encode(req.prompt, add_special=False, parse_special=True)
    extra: list[int] = []
    if fim["rep"] >= 0:
        extra += [fim["rep"]] + text("myproject\n")
    for chunk in req.input_extra or []:
        if fim["sep"] >= 0:
            extra += [fim["sep"]] + text(chunk.get("filename", "tmp") + "\n")
        else:
            extra += text(_CHUNK_SEP)
        extra += text(chunk["text"])
    if fim["sep"] >= 0:
        extra += [fim["sep"]] + text("filename\n")
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch + 2), len(extra))    # llama-server's - 2 * n_predict, n_predict -1
    head = [fim["pre"]] + prefix[len(prefix) - n_prefix:] + prompt
    tail = [fim["suf"]] + suffix[:n_suffix]
    if vocab.add_bos and tok.bos_id >= 0:
        head.insert(0, tok.bos_id)
    return extra[len(extra) - n_extra:] + head + tail + [fim["mid"]]


def _mixed(tok, value) -> list[int]:
    """input_prefix / input_suffix: text (no special tokens parsed) or a list of ids and text."""
    if isinstance(value, str):
        return tok.encode(value, add_special=False, parse_special=False)
    return tokenize_mixed(tok, value)


def check(req: NativeCompletionRequest) -> None:
    """llama-server's checks, in the order its answers show (a bad extra chunk first)."""
    for chunk in req.input_extra or []:
        if not isinstance(chunk.get("text"), str):
            raise invalid('extra_context chunk must contain a "text" field with a string value',
                          param="input_extra")
        if not isinstance(chunk.get("filename", ""), str):
            raise invalid('extra_context chunk\'s "filename" field must be a string', param="input_extra")
    if not isinstance(req.prompt, str):
        raise invalid('"prompt" must be a string', param="prompt")
    for name in ("input_prefix", "input_suffix"):
        if getattr(req, name) is None:
            raise invalid(f'"{name}" is required', param=name)


async def infill(api: API, request: Request) -> Response:
    """POST /infill."""
    body = await api.json_body(request)
    body.setdefault("prompt", "")          # optional here, unlike /completion
    req = NativeCompletionRequest.model_validate(text_logit_bias(api.engine.tokenizer, body))
    check(req)
    e = api.engine
    prompt = infill_prompt(e.tokenizer, req, e.n_ctx, api.cfg.n_batch)
    return await answer(api, request, req, [prompt])
