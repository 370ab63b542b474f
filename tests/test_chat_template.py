"""Chat templates rendered as llama-server renders them (its /apply-template)."""
import json
import os

import pytest

from ggserve.models.chat_template import CHATML, ChatTemplate, TemplateError
from ggserve.native.gguf_file import GGUFFile

DATA = os.path.join(os.path.dirname(__file__), "data")
GOLDEN = json.load(open(os.path.join(DATA, "chat_template.json"), encoding="utf-8"))


def _cases(model):
    return [pytest.param(c, id=c["key"]) for c in GOLDEN["models"][model]]


def _render(template, request):
    messages = request["messages"]
    prefill = messages[-1]["role"] == "assistant"   # llama-server continues it
    return template.render(messages, add_generation_prompt=request.get("add_generation_prompt", True),
                           continue_final_message=prefill)


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return ChatTemplate.from_metadata(GGUFFile(smollm2_path).metadata)


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    return ChatTemplate.from_metadata(GGUFFile(gemma3_path).metadata)


@pytest.mark.parametrize("case", _cases("smollm2"))
def test_smollm2_template_matches_llama_cpp(smollm2, case):
    assert _render(smollm2, case["request"]) == case["prompt"]


@pytest.mark.parametrize("case", _cases("gemma3"))
def test_missing_template_falls_back_to_chatml_like_llama_cpp(gemma3, case):
    assert _render(gemma3, case["request"]) == case["prompt"]


def test_missing_template_warns(gemma3_path, caplog):
    template = ChatTemplate.from_metadata(GGUFFile(gemma3_path).metadata)
    assert template.source == CHATML
    assert "no tokenizer.chat_template" in caplog.text


def test_bos_and_eos_token_texts_come_from_the_vocab(smollm2):
    assert (smollm2.bos_token, smollm2.eos_token) == ("<|im_start|>", "<|im_end|>")


def test_image_part_becomes_marker_in_string_only_template(smollm2):
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "Describe this image."}]}]
    assert not smollm2.supports_typed_content
    assert smollm2.render(messages) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\n<__media__>Describe this image.<|im_end|>\n<|im_start|>assistant\n")


TYPED = ("{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
         "{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}{% endfor %}")


def test_typed_content_template_sees_text_parts():
    t = ChatTemplate(TYPED)
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert t.supports_typed_content
    assert t.render(messages) == "[a][b]"


def test_content_with_an_image_is_one_string_even_for_a_typed_template():
    # llama.cpp's common_chat_msg::to_json_oaicompat joins content that holds media
    t = ChatTemplate(TYPED)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    assert t.render(messages, image_marker="<img>") == "<img>hi"


def test_raise_exception_carries_the_template_message():
    t = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}")
    with pytest.raises(TemplateError) as e:
        t.render([{"role": "user", "content": "x"}])
    assert e.value.message == "Conversation roles must alternate"


def test_trim_and_lstrip_blocks_as_hf():
    t = ChatTemplate("{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}")
    assert t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a\nb\n"


def test_tojson_keeps_non_ascii_and_tools_are_passed():
    t = ChatTemplate("{{ tools | tojson }}|{{ {'k': 'é'} | tojson(indent=1) }}")
    assert t.render([], tools=[{"name": "f"}]) == '[{"name": "f"}]|{\n "k": "é"\n}'


def test_strftime_now_and_extra_variables():
    t = ChatTemplate("{{ strftime_now('%Y') | length }} {{ bos_token }}{{ custom }}", bos_token="<s>")
    assert t.render([], custom="!") == "4 <s>!"


def test_sandbox_blocks_unsafe_attribute_access():
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(TemplateError):
        t.render([])


def test_syntax_error_is_a_template_error():
    with pytest.raises(TemplateError):
        ChatTemplate("{% for %}")


def test_template_file_override(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    assert ChatTemplate(path.read_text()).render([{"role": "user", "content": "hi"}]) == "<user>hi"
