"""The vocabulary of a GGUF file: token texts, attributes, special ids and flags.

Mirrors what llama.cpp's llama_vocab::impl::load derives from `tokenizer.ggml.*`,
including its text-based detection of end-of-generation tokens.
"""
from __future__ import annotations

import enum
import logging

import numpy as np

from .pretokenize import PRE_TYPES, PreSpec
from .token_index import TokenIndex
from .token_texts import TokenTexts

log = logging.getLogger(__name__)


class Attr(enum.IntFlag):
    """Token attributes, same bits as llama.h's llama_token_attr."""
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# GGUF tokenizer.ggml.token_type -> attribute
_TYPE_ATTR = {0: Attr.UNDEFINED, 1: Attr.NORMAL, 2: Attr.UNKNOWN, 3: Attr.CONTROL,
              4: Attr.USER_DEFINED, 5: Attr.UNUSED, 6: Attr.BYTE}

# tokens that end generation, found by their text (llama.cpp issue 9606)
EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
)
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# special id -> GGUF key (tokenizer.ggml.<key>); "seperator" is GGUF's spelling
_ID_KEYS = {
    "bos": ("bos_token_id",), "eos": ("eos_token_id",), "eot": ("eot_token_id",),
    "eom": ("eom_token_id",), "unk": ("unknown_token_id",), "sep": ("seperator_token_id",),
    "pad": ("padding_token_id",), "mask": ("mask_token_id",),
    "fim_pre": ("fim_pre_token_id", "prefix_token_id"), "fim_suf": ("fim_suf_token_id", "suffix_token_id"),
    "fim_mid": ("fim_mid_token_id", "middle_token_id"), "fim_pad": ("fim_pad_token_id",),
    "fim_rep": ("fim_rep_token_id",), "fim_sep": ("fim_sep_token_id",),
}
SPECIAL_ATTRS = int(Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN)
HIDDEN_ATTRS = int(Attr.CONTROL | Attr.UNKNOWN)  # not rendered unless special=True


class Vocab:
    """Token table plus llama.cpp's derived settings; `model` is "bpe" or "spm"."""

    def __init__(self, meta: dict):
        def get(key, default=None):
            return meta.get("tokenizer.ggml." + key, default)

        kind = get("model")
        if kind == "llama":
            self.model = "spm"
            ids = {"bos": 1, "eos": 2, "unk": 0}
            self.add_space_prefix, self.add_bos, self.clean_spaces = True, True, False
            self.pre = PreSpec((), clean_spaces=False)
        elif kind in ("gpt2", "gemma4"):
            self.model = "bpe"
            ids = {"bos": 11, "eos": 11} if kind == "gpt2" else {}
            self.add_space_prefix, self.add_bos, self.clean_spaces = False, False, True
            self.pre = PRE_TYPES["gemma4"] if kind == "gemma4" else _pre_spec(get("pre"))
            self.clean_spaces = self.pre.clean_spaces
            if self.pre.add_bos is not None:
                self.add_bos = self.pre.add_bos
        else:
            raise ValueError(f"unsupported tokenizer model {kind!r} (want 'gpt2', 'gemma4' or 'llama')")
        self.add_eos = False
        self.merges: list[str] = list(get("merges") or [])
        self.add_space_prefix = bool(get("add_space_prefix", self.add_space_prefix))

        self.tokens = TokenTexts(t if t else f"[EMPTY_{i}]" for i, t in enumerate(get("tokens")))
        n = len(self.tokens)
        scores = get("scores")
        self.scores = np.zeros(n, np.float32) if scores is None else np.asarray(scores, np.float32)
        types = get("token_type")
        types = np.ones(n, np.int64) if types is None else np.asarray(types, np.int64)
        table = np.zeros(8, np.int64)   # types outside 0..6 are undefined
        for t, a in _TYPE_ATTR.items():
            table[t] = int(a)
        self.attrs: list[int] = table[np.where((types >= 0) & (types < 7), types, 7)].tolist()
        self.token_to_id = TokenIndex(self.tokens)       # text -> its lowest id

        for name, keys in _ID_KEYS.items():
            value = ids.get(name, -1)
            if value >= n:
                value = -1
            for key in keys:
                v = get(key)
                if v is not None:
                    value = int(v) if 0 <= int(v) < n else value
                    break
            setattr(self, name, value)
        self.add_sep = False       # only reranking prompts read it (llama.cpp: true for BERT-like vocabs)
        for flag, key in (("add_bos", "add_bos_token"), ("add_eos", "add_eos_token"), ("add_sep", "add_sep_token")):
            v = get(key)
            if v is not None:
                setattr(self, flag, bool(v))
        if kind == "gemma4":
            self.add_bos = True   # llama.cpp overrides a false add_bos_token for Gemma 4 (its PR 21500)

        self._detect_specials()
        self.eog: frozenset[int] = self._eog_ids()
        self._apply_model_quirks(meta)
        special = int(SPECIAL_ATTRS)
        self.special_ids = [i for i, a in enumerate(self.attrs) if a & special]
        self.special_ids.sort(key=lambda i: -len(self.tokens.utf8(i)))

    # -- derived special tokens --

    def _force_control(self, i: int) -> None:
        if not self.attrs[i] & Attr.CONTROL:
            log.info("control-looking token %d %r was not control-type; overriding", i, self.tokens[i])
            self.attrs[i] |= int(Attr.CONTROL)

    def _find(self, texts) -> int:
        found = [self.token_to_id[t] for t in texts if t in self.token_to_id]
        return min(found) if found else -1

    def _detect_specials(self) -> None:
        if self.eot < 0:
            self.eot = self._find(_EOT_TEXTS)
            if self.eot >= 0:
                self._force_control(self.eot)
        if self.eom < 0:
            self.eom = self._find(("<|eom_id|>",))
            if self.eom >= 0:
                self._force_control(self.eom)
        for name, texts in _FIM_TEXTS.items():
            if getattr(self, name) < 0:
                setattr(self, name, self._find(texts))
                if getattr(self, name) >= 0:
                    self._force_control(getattr(self, name))
        control, unused = int(Attr.CONTROL), int(Attr.UNUSED)
        for i, a in enumerate(self.attrs):
            if a & control and "unused" in self.tokens[i]:
                self.attrs[i] = a | unused

    def _eog_ids(self) -> frozenset[int]:
        eog = {i for i in (self.fim_pad, self.fim_rep, self.fim_sep) if i >= 0}
        for text in EOG_TEXTS:
            i = self.token_to_id.get(text)
            if i is not None:
                eog.add(i)
                self._force_control(i)
        for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            i = self.token_to_id.get(text)
            if i is not None:   # gpt-oss: always rendered
                self.attrs[i] = int(Attr.USER_DEFINED)
        eog |= {i for i in (self.eos, self.eot, self.eom) if i >= 0}
        texts = {self.tokens[i] for i in eog}
        # harmony / solar-open: <|end|> ends a message, not the generation
        if "<|end|>" in texts and (("<|return|>" in texts and "<|call|>" in texts)
                                   or ({"<|calls|>", "<|flush|>"} <= texts)):
            end = self.token_to_id["<|end|>"]
            eog.discard(end)
            self.attrs[end] = int(Attr.USER_DEFINED)
        if "<|tool_response>" in texts and "</s>" in texts:   # gemma4, paddleocr
            s = self.token_to_id["</s>"]
            eog.discard(s)
            self.attrs[s] = int(Attr.NORMAL)
        return frozenset(eog)

    def _apply_model_quirks(self, meta: dict) -> None:
        """Per-token strip attributes llama.cpp sets by model name (not stored in GGUF)."""
        name = str(meta.get("general.name", "")).lower()
        pre = str(meta.get("tokenizer.ggml.pre", ""))
        arch = str(meta.get("general.architecture", ""))
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
                any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
            if "<mask>" in self.token_to_id:
                self.attrs[self.token_to_id["<mask>"]] |= int(Attr.LSTRIP)
        elif "phi-3" in name or "phi3" in name:
            for i, a in enumerate(self.attrs):
                if a & SPECIAL_ATTRS:
                    self.attrs[i] |= int(Attr.RSTRIP)
            for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                i = self.token_to_id.get(text)
                if i is not None:
                    rstrip = int(Attr.RSTRIP)
                    self.attrs[i] = self.attrs[i] | rstrip if on else self.attrs[i] & ~rstrip


def _pre_spec(pre: str | None) -> PreSpec:
    if not pre:
        log.warning("GGUF has no tokenizer.ggml.pre: using the 'default' pre-tokenizer; "
                    "generation quality will be degraded, consider regenerating the model")
        return PRE_TYPES["default"]
    spec = PRE_TYPES.get(pre)
    if spec is None:
        # llama.cpp refuses unknown types; older llama.cpp used 'default', and so do we
        log.warning("unknown pre-tokenizer type %r: falling back to 'default'", pre)
        return PRE_TYPES["default"]
    return spec
