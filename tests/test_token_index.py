"""The vocabulary's text -> id lookup (models/tokenizer/token_index.py): what a dict
built with setdefault over the tokens gives, in a fraction of its memory."""
from ggserve.models.tokenizer import token_index
from ggserve.models.tokenizer.token_index import TokenIndex
from ggserve.models.tokenizer.tokenizer import Tokenizer


def test_every_token_text_finds_its_lowest_id(smollm2_path):
    tokens = Tokenizer.from_gguf(smollm2_path).vocab.tokens
    index = TokenIndex(tokens)
    first = {}
    for i, t in enumerate(tokens):
        first.setdefault(t, i)
    assert len(tokens) == 49152
    assert all(index.get(t) == i for t, i in first.items())
    assert index["<|im_start|>"] == 1 and "<|im_end|>" in index


def test_a_text_held_twice_gives_the_lower_id_and_an_unknown_text_none():
    index = TokenIndex(["a", "b", "a", "c"])
    assert (index.get("a"), index.get("c"), index.get("zz"), index.get("zz", -1)) == (0, 3, None, -1)
    assert "zz" not in index and 3 not in index


def test_colliding_hashes_are_told_apart_by_their_text(monkeypatch):
    monkeypatch.setattr(token_index, "hash", lambda text: 7, raising=False)   # every hash equal
    index = TokenIndex(["x", "y", "x", "z"])
    assert [index.get(t) for t in ("x", "y", "z", "w")] == [0, 1, 3, None]


def test_it_takes_12_bytes_a_token():
    index = TokenIndex([f"t{i}" for i in range(151936)])
    assert index._hashes.nbytes + index._ids.nbytes == 12 * 151936
