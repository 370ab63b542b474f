"""Pre-tokenizers of byte-level BPE vocabularies, chosen by `tokenizer.ggml.pre`.

llama.cpp splits text with a list of regexes per pre-tokenizer type; each regex
splits the pieces left by the previous one, and text between matches stays a
piece of its own. It evaluates them on a "collapsed" copy of the text in which
every non-ASCII code point is replaced by one byte standing for its Unicode
category (letters 0xD2, numbers 0xD1, ...; non-ASCII whitespace becomes \\v), so
that `\\p{L}` and friends become plain byte classes. We do the same with Python's
`re` (ASCII mode, like ECMAScript's `\\s`/`\\d`/`\\b`), which gives the same
pieces as llama.cpp, including its hand-written GPT-2 and Llama-3 splitters
(their rules are exactly the regexes below, with a trailing `\\s+`).
ref: llama.cpp src/unicode.cpp unicode_regex_split, src/llama-vocab.cpp llm_tokenizer_bpe
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# --- the regexes, as llama.cpp writes them (\p{..} classes, ECMAScript syntax) ---

_CONTRACTIONS_CI = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5: combining marks stay inside words
QWEN35 = (_CONTRACTIONS_CI + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
          r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CASED_WORDS = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS_CI + "?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS_CI + "?"
)
GPT4O = _CASED_WORDS + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK3 = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
DEEPSEEK_CODER = [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"]
DEEPSEEK_LLM = [
    r"[\r\n]",
    # the Latin/Greek/Cyrillic... letter ranges of deepseek-llm's tokenizer.json
    r"\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    r"\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    r"\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    r"\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    r"\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    r"\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    r"\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    r"\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    r"\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    r"\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    r"\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    r"\U0001e900-\U0001e943]+",
    r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}+",
]
DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]
BLOOM = [r" ?[^(\s|.,!?…。，、।۔،)]+"]


@dataclass(frozen=True)
class PreSpec:
    """How one pre-tokenizer type splits and what it implies for the vocab."""
    regexes: tuple[str, ...]
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool | None = None  # default before the GGUF's add_bos_token, None: keep
    # SPM-style BPE (gemma-4): spaces become U+2581, words are raw UTF-8 (no GPT-2
    # byte alphabet) and a piece without a token falls back to <0xXX> byte tokens
    spm_style: bool = False


def _spec(regexes, **kw) -> PreSpec:
    return PreSpec(tuple([regexes] if isinstance(regexes, str) else regexes), **kw)


# tokenizer.ggml.pre -> spec, as llama.cpp's llama_vocab::impl::load maps them
PRE_TYPES: dict[str, PreSpec] = {}
for _names, _spec_ in [
    (("default",), _spec(DEFAULT)),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano", "dbrx", "smaug-bpe"),
     _spec(LLAMA3, ignore_merges=True, add_bos=True)),
    (("deepseek-llm",), _spec(DEEPSEEK_LLM, clean_spaces=False)),
    (("deepseek-coder",), _spec(DEEPSEEK_CODER, clean_spaces=False)),
    (("deepseek-v3", "hunyuan-dense", "joyai-llm"), _spec(DEEPSEEK3, clean_spaces=False)),
    (("falcon",), _spec([r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"])),
    (("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"), _spec([r"\p{N}", GPT2])),
    (("command-r", "smollm"), _spec([r"\p{N}", GPT2], clean_spaces=False)),
    (("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
      "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais",
      "exaone4"), _spec(GPT2)),
    (("trillion", "granite-docling"), _spec(GPT2, clean_spaces=False)),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2"),
     _spec(QWEN2, clean_spaces=False)),
    (("qwen35",), _spec(QWEN35, clean_spaces=False)),
    (("megrez", "stablelm2"), _spec(QWEN2)),
    (("chatglm-bpe", "glm4"), _spec(LLAMA3)),
    (("tekken",), _spec(TEKKEN, clean_spaces=False, ignore_merges=True, add_bos=True)),
    (("gpt-4o", "llama4", "kanana2", "minimax-m2"), _spec(GPT4O, clean_spaces=False)),
    (("gemma4",), _spec([r"[^\n]+|[\n]+"], spm_style=True)),
    (("poro-chat",), _spec(BLOOM, clean_spaces=False)),
    (("bloom", "gpt3-finnish"), _spec(BLOOM)),
    (("viking",), _spec([BLOOM[0], r"\p{N}"], clean_spaces=False)),
]:
    for _name in _names:
        PRE_TYPES[_name] = _spec_


# --- the collapsed alphabet ---

_WS = frozenset([0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
_CATEGORY_BYTE = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
# what \p{X} becomes: its collapsed byte plus its ASCII members
_CLASS = {
    "N": r"\xd10-9",
    "L": r"\xd2A-Za-z",
    "P": r"\xd3!-#%-*,-/:;?@\[-\]_\{\}",
    "M": r"\xd4",
    "S": r"\xd5\$\+<->\^`\|",
}
for _sub in ("Lu", "Ll", "Lt", "Lm", "Lo"):
    _CLASS[_sub] = _CLASS["L"]


class _Collapse(dict):
    """str.translate table: non-ASCII code point -> its category byte (filled lazily)."""

    def __init__(self, keep_non_ascii: bool):
        super().__init__()
        self.keep = keep_non_ascii

    def __missing__(self, cpt: int) -> str:
        if cpt in _WS:
            value = "\x0b"
        elif self.keep or cpt < 0x80:
            value = chr(cpt)
        else:
            value = _CATEGORY_BYTE.get(unicodedata.category(chr(cpt))[0], "\xd0")
        self[cpt] = value
        return value


_COLLAPSE = _Collapse(keep_non_ascii=False)
_WS_ONLY = _Collapse(keep_non_ascii=True)   # for regexes without \p{..}: only whitespace folds

_PROP = re.compile(r"\\p\{(\w+)\}")


def _translate(expr: str) -> tuple[re.Pattern, bool]:
    """A llama.cpp regex -> (Python pattern over the collapsed text, uses categories)."""
    uses_categories = bool(_PROP.search(expr))
    out, inside, i = [], False, 0
    while i < len(expr):
        c = expr[i]
        if c == "\\":
            m = _PROP.match(expr, i)
            if m:
                body = _CLASS[m.group(1)]
                out.append(body if inside else "[" + body + "]")
                i = m.end()
                continue
            out.append(expr[i:i + 2])
            i += 2
            continue
        if c == "[" and not inside:
            inside = True
        elif c == "]" and inside:
            inside = False
        out.append(c)
        i += 1
    return re.compile("".join(out), re.ASCII), uses_categories


class PreTokenizer:
    """Splits a text fragment into the words that BPE merges within."""

    def __init__(self, regexes: tuple[str, ...]):
        self._steps = [_translate(r) for r in regexes]

    def split(self, text: str) -> list[str]:
        if not text:
            return []
        collapsed = keep_ws = None
        ascii_text = text.isascii()
        bounds = [(0, len(text))]
        for pattern, uses_categories in self._steps:
            if ascii_text:
                subject = text
            elif uses_categories:
                collapsed = collapsed or text.translate(_COLLAPSE)
                subject = collapsed
            else:
                keep_ws = keep_ws or text.translate(_WS_ONLY)
                subject = keep_ws
            new_bounds = []
            add = new_bounds.append
            for start, end in bounds:
                prev = start
                for m in pattern.finditer(subject, start, end):
                    s, e = m.span()
                    if s == e:
                        continue
                    if s > prev:
                        add((prev, s))
                    add((s, e))
                    prev = e
                if prev < end:
                    add((prev, end))
            drop(bounds)
            bounds = new_bounds
        words = [text[s:e] for s, e in bounds]
        drop(bounds)
        return words


def drop(items: list) -> None:
    """Empty a list a slice at a time: freeing millions of objects in one call holds the
    GIL for a third of a second (a 10 MB text), which would stall the server's event loop."""
    while items:
        del items[-65536:]
