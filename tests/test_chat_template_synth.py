"""Chat templates of the dense issue-16 models (Qwen3, Phi-3.5, Ministral 3, Gemma 4,
each the real template of its family) rendered as llama-server's /apply-template
renders them, and the prompt ids it tokenizes them to
(../shared/golden/synth/out/synth_chat.json)."""
import pytest

from ggserve.models.chat_template import ChatTemplate
from ggserve.models.tokenizer import Tokenizer
from ggserve.native.gguf_file import GGUFFile
from synth_golden import chat, model_path

ARCHS = ("qwen3", "phi3", "mistral3", "gemma4")
ARCHS += ("olmo2", "smollm3", "seed_oss")             # issue 31 (golden README "Second batch")
ARCHS += ("exaone4",)
ARCHS += ("gemma4e",)
ARCHS += ("cohere2",)
GOLDEN = chat()["models"]
CASES = [pytest.param(arch, c, id=f"{arch}-{c['key']}") for arch in ARCHS for c in GOLDEN[arch]]


@pytest.fixture(scope="module")
def models():
    made = {}

    def get(arch):
        if arch not in made:
            meta = GGUFFile(model_path(arch)).metadata
            tok = Tokenizer.from_metadata(meta)
            made[arch] = ChatTemplate.from_metadata(meta, add_bos=tok.vocab.add_bos), tok
        return made[arch]
    return get


@pytest.mark.parametrize("arch,case", CASES)
def test_template_renders_as_llama_cpp(models, arch, case):
    template, _ = models(arch)
    request = case["request"]
    messages = request["messages"]
    text = template.render(messages, add_generation_prompt=request.get("add_generation_prompt", True),
                           tools=request.get("tools"), continue_final_message=messages[-1]["role"] == "assistant")
    assert text == case["prompt"]


@pytest.mark.parametrize("arch,case", CASES)
def test_rendered_prompt_tokenizes_as_llama_cpp(models, arch, case):
    _, tok = models(arch)
    assert tok.encode(case["prompt"], add_special=True, parse_special=True) == \
        case["prompt_ids_add_special_parse_special"]


def test_gemma4_template_bos_is_dropped_because_the_tokenizer_adds_it(models):
    template, tok = models("gemma4")
    text = template.render([{"role": "user", "content": "Hi"}])
    assert not text.startswith("<bos>") and tok.encode(text, add_special=True, parse_special=True)[:2] == [2, 105]


def test_prefill_continues_where_the_generation_prompt_differs(models):
    # Phi-3.5 ends a prompt without generation prompt with <|endoftext|>: llama.cpp
    # appends only the differing part of the generation prompt, then the prefill
    template, _ = models("phi3")
    text = template.render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}],
                           continue_final_message=True)
    assert text == "<|user|>\nHi<|end|>\n<|endoftext|>assistant|>\nHel"


def test_ministral3_reasoning_content_becomes_a_thinking_block(models):
    template, _ = models("mistral3")
    text = template.render([{"role": "user", "content": "2+2?"},
                            {"role": "assistant", "content": "4", "reasoning_content": "Add."},
                            {"role": "user", "content": "3*5?"}])
    assert text.endswith("[INST]2+2?[/INST][THINK]Add.[/THINK]4<|endoftext|>[INST]3*5?[/INST]")


def test_ministral3_prefill_is_written_as_llama_cpps_ministral3_handler_writes_it(models):
    template, _ = models("mistral3")
    text = template.render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}],
                           continue_final_message=True)
    assert text.endswith("[INST]Hi[/INST][THINK][/THINK]Hel")
