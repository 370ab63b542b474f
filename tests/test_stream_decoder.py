"""Streaming detokenization: whole characters at every step, same text as a whole decode."""
import pytest

from ggserve.models.tokenizer import StreamDecoder, Tokenizer

TEXTS = [
    "😀 😃 🎉 👍🏽",
    "👨\u200d👩\u200d👧\u200d👦 family, 🏳️\u200d🌈 flag",
    "你好，世界！这是一个测试。",
    "日本語のテキストです。カタカナとひらがな。",
    "한국어 텍스트입니다.",
    "Hello 世界 🌍 123 café مرحبا done",
    "🇺🇸🇯🇵🇩🇪 ∑ ∫ √ ∞",
    "rare: 𓀀 𠀋 ꙮ 🯰 \U0001FAE8",   # byte-fallback tokens in Gemma's SPM
]


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def tokenizer(request, smollm2_path, gemma3_path):
    return Tokenizer.from_gguf({"smollm2": smollm2_path, "gemma3": gemma3_path}[request.param])


def _stream(tok, ids, **kw):
    dec = StreamDecoder(tok, **kw)
    return [dec.push(i) for i in ids] + [dec.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_stream_equals_whole_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special=False)
    assert "".join(_stream(tokenizer, ids)) == tokenizer.decode(ids) == text


@pytest.mark.parametrize("text", TEXTS)
def test_every_step_is_valid_utf8(tokenizer, text):
    for chunk in _stream(tokenizer, tokenizer.encode(text, add_special=False)):
        assert "\ufffd" not in chunk
        chunk.encode("utf-8")   # no lone surrogates either


def test_multibyte_characters_are_split_across_tokens(tokenizer):
    # the point of the two tests above: some token ends inside a character
    ids = tokenizer.encode("👍🏽 你好 𓀀 ꙮ", add_special=False)
    assert any(tokenizer.token_bytes(i).decode("utf-8", "ignore").encode() != tokenizer.token_bytes(i)
               for i in ids)


def test_held_back_bytes_come_out_when_complete(tokenizer):
    ids = tokenizer.encode("𓀀", add_special=False)   # one byte per token in both vocabularies
    assert len(ids) == 4
    assert _stream(tokenizer, ids) == ["", "", "", "𓀀", ""]


def test_incomplete_tail_is_flushed_as_replacement(smollm2_path):
    tok = Tokenizer.from_gguf(smollm2_path)
    first = tok.encode("😀", add_special=False)[0]   # a lone leading byte of the emoji
    dec = StreamDecoder(tok)
    assert dec.push(first) == "" and dec.pending
    assert dec.flush() == "\ufffd"


def test_special_tokens_hidden_unless_asked(smollm2_path):
    tok = Tokenizer.from_gguf(smollm2_path)
    ids = tok.encode("Hi<|im_end|>", add_special=False, parse_special=True)
    assert "".join(_stream(tok, ids)) == "Hi"
    assert "".join(_stream(tok, ids, show_special=True)) == "Hi<|im_end|>"
