"""llama.cpp's built-in chat templates by name (`--chat-template NAME`), as Jinja.

Written from the formats in llama.cpp's `src/llama-chat.cpp`; each renders what
llama.cpp's C++ renderer writes for the same messages.
"""
from __future__ import annotations

from .chat_template import CHATML

_CONTENT = "{%- set c = message['content'] if message['content'] is string else '' -%}"

BUILTIN = {
    "chatml": CHATML,
    "llama3": (
        "{{- bos_token -}}{%- for message in messages -%}" + _CONTENT +
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + c | trim + '<|eot_id|>' -}}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"),
    "command-r": (
        "{%- for message in messages -%}" + _CONTENT +
        "{%- set tag = {'system': 'SYSTEM', 'user': 'USER', 'assistant': 'CHATBOT'}.get(message['role']) -%}"
        "{%- if tag -%}{{- '<|START_OF_TURN_TOKEN|><|' + tag + '_TOKEN|>' + c | trim + '<|END_OF_TURN_TOKEN|>' -}}{%- endif -%}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}{%- endif -%}"),
    "gemma": (
        "{{- bos_token -}}{%- for message in messages -%}" + _CONTENT +
        "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
        "{{- '<start_of_turn>' + role + '\\n' + c | trim + '<end_of_turn>\\n' -}}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"),
    "phi3": (
        "{%- for message in messages -%}" + _CONTENT +
        "{{- '<|' + message['role'] + '|>\\n' + c + '<|end|>\\n' -}}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"),
    "zephyr": (
        "{%- for message in messages -%}" + _CONTENT +
        "{{- '<|' + message['role'] + '|>\\n' + c + '<|endoftext|>\\n' -}}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"),
}
