"""Tokenizers of the synthetic models' vocabularies against llama.cpp's /tokenize and
/detokenize (../shared/golden/synth/out/synth_tokenize.json: the corpus strings in
three modes, for each vocabulary)."""
import pytest

from ggserve.models.tokenizer import Tokenizer

from synth_golden import SYNTH, tokenize

GOLDEN = tokenize()
VARIANTS = {v["name"]: v for v in GOLDEN["variants"]}
VOCABS = sorted(GOLDEN["vocabs"])


@pytest.fixture(scope="module", params=VOCABS)
def vocab(request):
    golden = GOLDEN["vocabs"][request.param]
    return Tokenizer.from_gguf(str(SYNTH / "models" / golden["model"])), golden


def test_every_vocabulary_of_the_issue_is_in_the_golden():
    # the golden's second batch (deepseek2, glm4moe, lfm2, ...) adds vocabularies to these
    assert set(VOCABS) >= {"qwen2+qwen3_added_tokens", "qwen35+qwen3_added_tokens", "phi-3", "gemma-4",
                           "gpt-2", "o200k_harmony"}


def test_encode_matches_llama_cpp(vocab):
    tok, golden = vocab
    wrong = []
    for entry in golden["strings"]:
        for name, expected in entry["variants"].items():
            v = VARIANTS[name]
            ids = tok.encode(entry["text"], add_special=v["add_special"], parse_special=v["parse_special"])
            if ids != expected["ids"]:
                wrong.append((entry["key"], name, ids, expected["ids"]))
    assert wrong == []


def test_token_bytes_match_llama_cpp_pieces(vocab):
    tok, golden = vocab
    for entry in golden["strings"]:
        for expected in entry["variants"].values():
            pieces = [p.encode() if isinstance(p, str) else bytes(p) for p in expected["pieces"]]
            assert [tok.token_bytes(i) for i in expected["ids"]] == pieces, entry["key"]


def test_pieces_joined_match_llama_server_detokenize(vocab):
    # llama-server's /detokenize concatenates token pieces (no space clean-up, no
    # SPM leading-space strip): "Hello" is " Hello" in phi-3's vocab there
    tok, golden = vocab
    for entry in golden["strings"]:
        expected = entry["variants"]["nobos_special"]
        text = b"".join(tok.token_bytes(i) for i in expected["ids"]).decode("utf-8", "replace")
        assert text == expected["detokenize"], entry["key"]


def test_qwen3_vocab_special_tokens():
    tok = Tokenizer.from_gguf(str(SYNTH / "models" / "synth-qwen3-q8_0.gguf"))
    assert (tok.n_vocab, tok.bos_id, tok.eos_id) == (151936, 151643, 151645)
    assert tok.encode("hi", add_special=True) == tok.encode("hi", add_special=False)   # add_bos_token false
    assert tok.encode("<think>\n", add_special=False, parse_special=True) == [151667, 198]
    # llama.cpp's EOG set (its load log): the FIM pad/repo/file-sep tokens and an old </s> too
    assert {i: tok.id_to_token(i) for i in tok.eog_ids} == {
        128247: "</s>", 151643: "<|endoftext|>", 151645: "<|im_end|>", 151662: "<|fim_pad|>",
        151663: "<|repo_name|>", 151664: "<|file_sep|>"}


def test_gemma4_vocab_escapes_spaces_and_falls_back_to_byte_tokens():
    tok = Tokenizer.from_gguf(str(SYNTH / "models" / "synth-gemma4-q8_0.gguf"))
    ids = tok.encode(" a  b", add_special=True)
    assert ids[0] == tok.bos_id == 2   # BOS although add_bos_token is false for Gemma 4
    assert "".join(tok.id_to_token(i) for i in ids[1:]) == "▁a▁▁b"
    assert tok.decode(ids, skip_special=True) == " a  b"
