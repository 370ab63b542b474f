"""Tokenizers from GGUF metadata against llama.cpp's own /tokenize and /detokenize."""
import json
import os

import pytest

from ggserve.models.tokenizer import Tokenizer

DATA = os.path.join(os.path.dirname(__file__), "data")
GOLDEN = json.load(open(os.path.join(DATA, "tokenize.json"), encoding="utf-8"))
VARIANTS = {v["name"]: v for v in GOLDEN["variants"]}
MODELS = ("smollm2", "gemma3")


def _cases(with_variant=True):
    return list(_iter_cases(with_variant))


def _iter_cases(with_variant):
    for model in MODELS:
        for entry in GOLDEN["models"][model]:
            if with_variant:
                for variant in entry["variants"]:
                    yield pytest.param(model, entry, variant, id=f"{model}-{entry['key']}-{variant}")
            else:
                yield pytest.param(model, entry, id=f"{model}-{entry['key']}")


@pytest.fixture(scope="module")
def tokenizers(smollm2_path, gemma3_path):
    return {"smollm2": Tokenizer.from_gguf(smollm2_path), "gemma3": Tokenizer.from_gguf(gemma3_path)}


@pytest.mark.parametrize("model,entry,variant", _cases())
def test_encode_matches_llama_cpp(tokenizers, model, entry, variant):
    v = VARIANTS[variant]
    ids = tokenizers[model].encode(entry["text"], add_special=v["add_special"],
                                   parse_special=v["parse_special"])
    assert ids == entry["variants"][variant]["ids"]


@pytest.mark.parametrize("model,entry,variant", _cases())
def test_token_bytes_match_llama_cpp_pieces(tokenizers, model, entry, variant):
    golden = entry["variants"][variant]
    expected = [p.encode() if isinstance(p, str) else bytes(p) for p in golden["pieces"]]
    assert [tokenizers[model].token_bytes(i) for i in golden["ids"]] == expected


@pytest.mark.parametrize("model,entry", _cases(with_variant=False))
def test_decode_matches_llama_cpp_detokenize(tokenizers, model, entry):
    golden = entry["variants"]["nobos_special"]
    assert tokenizers[model].decode(golden["ids"]) == golden["detokenize"]


@pytest.mark.parametrize("model,entry", _cases(with_variant=False))
def test_decode_of_encode_round_trips(tokenizers, model, entry):
    tok = tokenizers[model]
    assert tok.decode(tok.encode(entry["text"], add_special=False, parse_special=True)) == entry["text"]


def test_smollm2_special_ids(tokenizers):
    tok = tokenizers["smollm2"]
    assert (tok.n_vocab, tok.bos_id, tok.eos_id) == (49152, 1, 2)
    # <|endoftext|>, <|im_end|>, and <reponame> (a FIM repo token, which llama.cpp ends on)
    assert tok.eog_ids == {0, 2, 4}
    assert tok.token_to_id("<|im_start|>") == 1


def test_gemma3_special_ids(tokenizers):
    tok = tokenizers["gemma3"]
    assert (tok.n_vocab, tok.bos_id, tok.eos_id) == (262144, 2, 1)
    assert tok.eog_ids == {1, 106, 212}   # <eos>, <end_of_turn>, </s>
    assert tok.is_eog(tok.token_to_id("<end_of_turn>"))


def test_add_special_adds_bos_only_where_the_gguf_says(tokenizers):
    assert tokenizers["gemma3"].encode("hi", add_special=True)[0] == 2
    assert tokenizers["smollm2"].encode("hi", add_special=True) == tokenizers["smollm2"].encode("hi", add_special=False)


def test_control_tokens_are_text_without_parse_special(tokenizers):
    tok = tokenizers["smollm2"]
    assert 1 not in tok.encode("<|im_start|>", add_special=False, parse_special=False)
    assert tok.encode("<|im_start|>", add_special=False, parse_special=True) == [1]


def test_skip_special_hides_control_tokens(tokenizers):
    tok = tokenizers["gemma3"]
    ids = tok.encode("<start_of_turn>user\nHi<end_of_turn>", add_special=True, parse_special=True)
    assert tok.decode(ids) == "<bos><start_of_turn>user\nHi<end_of_turn>"
    assert tok.decode(ids, skip_special=True) == "user\nHi"
    assert tok.is_special(tok.token_to_id("<end_of_turn>"))
    assert not tok.is_special(tok.token_to_id("\n"))   # user-defined: ordinary text


def test_unknown_pre_tokenizer_falls_back_to_default_with_warning(smollm2_path, caplog):
    from ggserve.native.gguf_file import GGUFFile

    meta = dict(GGUFFile(smollm2_path).metadata)
    meta["tokenizer.ggml.pre"] = "no-such-pre"
    tok = Tokenizer.from_metadata(meta)
    assert "unknown pre-tokenizer type 'no-such-pre'" in caplog.text
    assert tok.decode(tok.encode("Hello world 123")) == "Hello world 123"


# -- pre-tokenizers without a golden model: literal splits of the HF regexes --

from ggserve.models.tokenizer.pretokenize import PRE_TYPES, PreTokenizer  # noqa: E402


@pytest.mark.parametrize("pre,text,words", [
    ("llama-bpe", "12345", ["123", "45"]),
    ("qwen2", "12345", ["1", "2", "3", "4", "5"]),
    ("gpt-2", "12345", ["12345"]),
    ("smollm", "12345", ["1", "2", "3", "4", "5"]),
    ("llama-bpe", "Hello, world!", ["Hello", ",", " world", "!"]),
    ("llama-bpe", "DON'T", ["DON", "'T"]),
    ("gpt-2", "DON'T", ["DON", "'", "T"]),
    ("llama-bpe", "x\n\n  y", ["x", "\n\n", " ", " y"]),
    ("gpt-2", "a  b ", ["a", " ", " b", " "]),
    ("llama-bpe", "(café)", ["(café", ")"]),   # one non-letter may lead a word
    ("gpt-2", "x\u00a0\u00a0y", ["x", "\u00a0", "\u00a0", "y"]),   # NBSP is \s, but only ' ' leads a word
    ("deepseek-coder", "ab\ncd 12", ["ab", "\n", "cd", " ", "1", "2"]),
])
def test_pre_tokenizer_splits(pre, text, words):
    assert PreTokenizer(PRE_TYPES[pre].regexes).split(text) == words


@pytest.mark.parametrize("pre", sorted(PRE_TYPES))
def test_every_pre_tokenizer_covers_the_text(pre):
    text = "Hello wörld 12345 — ça va? 你好 \n\n\t 'tis  done!!\u00a0😀"
    assert "".join(PreTokenizer(PRE_TYPES[pre].regexes).split(text)) == text
