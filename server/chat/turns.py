"""Where llama-server (build 11434) ends a chat prompt's batches at user messages.

For models whose memory cannot be cut back (sliding-window or recurrent layers)
llama-server saves context checkpoints at user-message starts and ends a prompt
batch there; `server/engine/kernel_parity.py` reproduces those batches. This module finds
the positions, the way llama-server does:

1. Message delimiters per role, from the chat template (common/chat.cpp
   common_chat_templates_apply_jinja): a template that one of llama.cpp's
   specialized handlers takes (common_chat_try_specialized_template, tested on the
   template's source in llama.cpp's order) gets that handler's fixed delimiters, or
   none; any other goes through the differential autoparser
   (common/chat-diff-analyzer.cpp), whose assistant and user start markers are
   what a rendering with one more message adds before that message's text
   (`calculate_diff_split`, `segmentize_markers`), patched by its workarounds.
2. Each delimiter tokenized alone (no BOS, special tokens parsed:
   tools/server common_tokenize(vocab, d, false, true)).
3. Message starts: at each prompt position outside image rows, the first delimiter
   (in list order) whose tokens follow (common_chat_msg_delimiters::split). A
   delimiter whose tokens do not occur in the prompt (BPE merged it with its
   neighbours there) starts nothing.
4. Cuts (server-context.cpp, the prompt batch loop): a batch ends before a user
   start when it is the last one, when the slot has no checkpoint yet, or when it is
   more than checkpoint_min_step past the last checkpoint; a checkpoint is taken
   when a batch starts at a user start or near the prompt's end (`batch_cuts`).

Known approximations (llama.cpp parts not reproduced): the autoparser's reasoning
analysis, which trims an assistant marker at the reasoning tags (here: at the first
marker naming "think"), and its content analysis, on which the Command R+
workaround depends (here: taken as not found); templates rendered by Python's
Jinja, not llama.cpp's; prompts computed from their start (a slot's earlier
checkpoints are not known here).
"""
from __future__ import annotations

USER, ASSISTANT, SYSTEM, TOOL = "user", "assistant", "system", "tool"

# llama-server's defaults (common/common.h, common/arg.cpp): -b, -ub, --checkpoint-min-step
# (EngineConfig.checkpoint_min_step, which turn_cuts is given)
N_BATCH = 2048
N_UBATCH = 512
CHECKPOINT_MIN_STEP = 8192
CHECKPOINT_OFFSETS = (4 + N_UBATCH, 4)   # batches end this many tokens before the prompt's end

# the autoparser's probe messages (common/chat-diff-analyzer.cpp)
USER_MSG = "U_USER_MSG Hello END_U"
USER_MSG_TWO = "V_USER_MSG Hello END_V"
ASSISTANT_MSG = "A_ASST_MSG I can help END_A"

_WS = " \t\n\v\f\r"      # C isspace


def _has(src: str, *needles: str) -> bool:
    return all(n in src for n in needles)


def specialized_delimiters(src: str) -> list[tuple[str, str]] | None:
    """The delimiters of llama.cpp's specialized handler for this template source
    ([] for handlers that set none), or None when no handler takes it."""
    if _has(src, "[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]") and "[CALL_ID]" not in src:
        return []                                                      # Ministral 3
    harmony = [(ASSISTANT, "<|start|>assistant"), (USER, "<|start|>user"), (SYSTEM, "<|start|>developer"),
               (SYSTEM, "<|start|>system"), (TOOL, "<|start|>functions")]
    if "chat_format=llm-jp-harmony-v1" in src:
        return harmony                                                 # LLM-jp harmony
    if "<|channel|>" in src:
        return harmony                                                 # GPT-OSS
    if _has(src, "<atem:function_calls>", "<|eom|>"):                  # Muse Glimmer
        return [(ASSISTANT, "<|start|>assistant"), (USER, "<|start|>user"), (SYSTEM, "<|start|>system"),
                (TOOL, "<|start|>tool")]
    if _has(src, ">>>all", ">>>${recipient}"):
        return []                                                      # Functionary v3.2
    if _has(src, "<|tool_calls_section_begin|>", "<|tool_call_begin|>"):
        return []                                                      # Kimi K2
    if _has(src, "<|open|>", "<|close|>", "<|end_of_msg|>"):           # Kimi K3
        return [(ASSISTANT, '<|open|>message role="assistant"<|sep|>'), (USER, '<|open|>message role="user"<|sep|>'),
                (TOOL, '<|open|>message role="tool"'), (SYSTEM, '<|open|>message role="system"')]
    if _has(src, "<role>ASSISTANT</role>", "<arg_key>"):               # Ling 3 / Bailing V3
        return [(ASSISTANT, "<role>ASSISTANT</role>"), (USER, "<role>HUMAN</role>"),
                (TOOL, "<role>OBSERVATION</role>"), (SYSTEM, "<role>SYSTEM</role>")]
    if _has(src, "<|START_TEXT|>", "<|START_ACTION|>"):                # Cohere2 MoE
        turn = "<|START_OF_TURN_TOKEN|>"
        return [(ASSISTANT, turn + "<|CHATBOT_TOKEN|>"), (USER, turn + "<|USER_TOKEN|>"),
                (TOOL, turn + "<|SYSTEM_TOKEN|><|START_TOOL_RESULT|>"), (SYSTEM, turn + "<|SYSTEM_TOKEN|>")]
    if _has(src, "<|tool_list_start|>", "<|tool_list_end|>"):
        return []                                                      # LFM2
    if "List of tools: [" in src and "<|tool_list_start|>" not in src:
        return []                                                      # LFM2.5
    if _has(src, "<|role_sep|>", "<|message_sep|>") and "<|function_call|>" not in src:
        return []                                                      # GigaChat V3
    if _has(src, "]<]minimax[>[", "<tool_call>", "<invoke name="):     # MiniMax-M3
        return [(ASSISTANT, "]~b]ai"), (USER, "]~b]user"), (TOOL, "]~b]tool"), (SYSTEM, "]~b]developer"),
                (SYSTEM, "]~b]system")]
    if _has(src, "dsml_token", "DSML") and ("function_calls" in src or "tool_calls" in src):
        return [(ASSISTANT, "<｜Assistant｜>"), (USER, "<｜User｜>")]    # DeepSeek V3.2 / V4
    if "'<|tool_call>call:'" in src:                                   # Gemma 4
        return [(USER, "<|turn>user"), (ASSISTANT, "<|turn>model")]
    if _has(src, "Tool usage guidelines:", '<function name="', '<param name="'):    # MiniCPM5
        return [(ASSISTANT, "<|im_start|>assistant"), (TOOL, "<|im_start|>user\n<tool_response>"),
                (USER, "<|im_start|>user"), (SYSTEM, "<|im_start|>system")]
    if _has(src, "<tool_call>", "<function=", "<parameter=") \
            and "'<tool_call><function=' ~ tool_call.name ~ '>'" not in src:    # Qwen3-Coder, Qwen3.5
        return [(ASSISTANT, "<|im_start|>assistant"), (TOOL, "<|im_start|>user\n<tool_response>"),
                (TOOL, "<|im_start|>tool_response"), (USER, "<|im_start|>user"), (SYSTEM, "<|im_start|>system")]
    return None


# -- the differential autoparser's markers -------------------------------------------

MARKER, TEXT = "marker", "text"


def segmentize_markers(text: str) -> list[tuple[str, str]]:
    """Text cut into <...> / [...] markers and the text between them."""
    out, start, opener = [], 0, ""
    for i, c in enumerate(text):
        if not opener and c in "<[":
            if start < i:
                out.append((TEXT, text[start:i]))
            start, opener = i, c
        elif opener and c == {"<": ">", "[": "]"}[opener]:
            out.append((MARKER, text[start:i + 1]))
            start, opener = i + 1, ""
    if start < len(text):
        out.append((TEXT, text[start:]))
    return out


def _common_prefix_len(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _common_suffix_len(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def diff_right(left: str, right: str) -> str:
    """What `right` adds to `left`: calculate_diff_split(left, right).right."""
    ls, rs = segmentize_markers(left), segmentize_markers(right)
    if not ls:
        return right
    if not rs:
        return ""
    l0, l1, r0, r1 = 0, len(ls) - 1, 0, len(rs) - 1
    l_full = r_full = False
    while l0 != l1 and r0 != r1:
        advanced = False
        if ls[l0] == rs[r0]:
            l0, r0, advanced = l0 + 1, r0 + 1, True
        if ls[l1] == rs[r1]:
            if l0 != l1:
                l1 -= 1
            else:
                l_full = True
            if r0 != r1:
                r1 -= 1
            else:
                r_full = True
            advanced = True
        if not advanced:
            break
    if l0 == l1 and r0 != r1:
        if ls[l0] == rs[r1]:
            r1, l_full = r1 - 1, True
        elif ls[l0] == rs[r0]:
            r0, l_full = r0 + 1, True
    elif r0 == r1 and l0 != l1:
        if ls[l1] == rs[r0]:
            l1, r_full = l1 - 1, True
        elif ls[l0] == rs[r0]:
            l0, r_full = l0 + 1, True
    elif l0 == l1 and r0 == r1 and ls[l0] == rs[r0] and ls[l0][0] == MARKER:
        l_full = r_full = True
    text_suffix = ls[l1][0] == TEXT and rs[r1][0] == TEXT
    text_prefix = rs[r0][0] == TEXT and ls[l0][0] == TEXT
    rem_l = "".join(v for _, v in ls[l0:l1 + (0 if l_full else 1)])
    rem_r = "".join(v for _, v in rs[r0:r1 + (0 if r_full else 1)])
    n_suffix = _common_suffix_len(rem_l, rem_r) if text_suffix else 0
    n_prefix = _common_prefix_len(rem_l[:len(rem_l) - n_suffix], rem_r[:len(rem_r) - n_suffix]) if text_prefix else 0
    d_left = rem_l[n_prefix:len(rem_l) - n_suffix]
    d_right = rem_r[n_prefix:len(rem_r) - n_suffix]
    if not d_left and not d_right:
        return ""                                    # no diff
    if not d_left and len(left) <= len(right) and right.startswith(left):
        return right[len(left):]                     # left is a prefix of right
    return d_right


def _render(template, messages) -> str | None:
    try:
        return template.render(messages, add_generation_prompt=False)
    except Exception:           # llama.cpp: the template application failed
        return None


def _user(text):
    return {"role": "user", "content": text}


def _assistant(text):
    return {"role": "assistant", "content": text}


def detect_user_start(template) -> str:
    """autoparser::detect_user_start_marker."""
    a, b = _render(template, []), _render(template, [_user(USER_MSG)])
    if a is None or b is None:
        a = _render(template, [_user(USER_MSG_TWO), _assistant(ASSISTANT_MSG)])
        b = _render(template, [_user(USER_MSG_TWO), _assistant(ASSISTANT_MSG), _user(USER_MSG)])
        if a is None or b is None:
            return ""
    msg = diff_right(a, b)
    if ASSISTANT_MSG in msg:
        msg = msg[msg.index(ASSISTANT_MSG) + len(ASSISTANT_MSG):]
    candidate = msg[:msg.index(USER_MSG)] if USER_MSG in msg else msg
    out, seen_marker = [], False
    for kind, value in segmentize_markers(candidate):
        low = value.lower()
        # end markers are dropped, and whitespace, before the first marker
        if kind == MARKER and not seen_marker and ("end" in low or "close" in low):
            continue
        if kind == TEXT and not seen_marker and not value.strip(_WS):
            continue
        seen_marker |= kind == MARKER
        out.append(value)
    return "".join(out).strip(_WS)


def detect_assistant_start(template) -> str:
    """autoparser::detect_assistant_start_marker (its cut at the reasoning tags
    approximated: at the first marker naming "think")."""
    a, b = _render(template, [_user(USER_MSG)]), _render(template, [_user(USER_MSG), _assistant(ASSISTANT_MSG)])
    if a is None or b is None:
        return ""
    msg = diff_right(a, b)
    prefix = msg[:msg.index(ASSISTANT_MSG)] if ASSISTANT_MSG in msg else msg
    pos = 0
    for kind, value in segmentize_markers(prefix):
        if kind == MARKER and "think" in value.lower():
            prefix = prefix[:pos]
            break
        pos += len(value)
    return prefix.strip(_WS)


def autoparser_delimiters(template) -> list[tuple[str, str]]:
    src = template.source
    assistant, user = detect_assistant_start(template), detect_user_start(template)
    # the autoparser's workarounds that set the markers
    if _has(src, "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"):        # Cohere Command R+
        user = "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"
    if _has(src, "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>"):    # Nemotron Nano v2
        assistant, user = "<SPECIAL_11>Assistant", "<SPECIAL_11>User"
    if ("{%- set system_prompt = '<|start_header_id|>' + 'system' + '<|end_header_id|>\\n\\n' + "
            "message['content'] | trim + '\\n' + system_prompt_suffix + '<|eot_id|>' -%}") in src:   # Fireworks
        assistant = "<|start_header_id|>assistant<|end_header_id|>"
        user = "<|start_header_id|>user<|end_header_id|>"
    if "<|begin|>assistant<|think|><|end|>" in src:                    # Solar Open
        assistant = "<|begin|>assistant"
    if "if not loop.last and '[BEGIN FINAL RESPONSE]' in asst_text" in src:    # Apriel 1.6
        assistant, user = "<|begin_assistant|>", "<|begin_user|>"
    return [(role, d) for role, d in ((ASSISTANT, assistant), (USER, user)) if d]


def message_delimiters(template) -> list[tuple[str, str]]:
    """(role, text) per delimiter, in llama.cpp's matching order."""
    special = specialized_delimiters(template.source)
    return special if special is not None else autoparser_delimiters(template)


def tokenized_delimiters(template, tokenizer) -> list[tuple[str, list[int]]]:
    """Each delimiter tokenized alone: no BOS, special tokens parsed."""
    return [(role, tokenizer.encode(d, add_special=False, parse_special=True))
            for role, d in message_delimiters(template)]


# -- in the prompt ---------------------------------------------------------------------

def user_starts(prompt: list[int], spans, delimiters) -> list[int]:
    """Positions where a user message starts: common_chat_msg_delimiters::split over
    the prompt, image rows skipped (and never part of a match)."""
    images = set()
    for span in spans:
        images.update(range(span.start, span.end))
    n = len(prompt)
    out = []
    for i in range(n):
        if i in images:
            continue
        for role, toks in delimiters:
            k = len(toks)
            if i + k <= n and list(prompt[i:i + k]) == list(toks) and not images.intersection(range(i, i + k)):
                if role == USER:
                    out.append(i)
                break
    return out


def batch_cuts(n_prompt: int, spans, users: list[int], *, n_batch: int = N_BATCH, n_ubatch: int = N_UBATCH,
               min_step: int = CHECKPOINT_MIN_STEP) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """llama-server's prompt batch loop for a prompt computed from its start, for a
    model that takes context checkpoints -> (user starts where a batch ends,
    positions where a checkpoint is taken)."""
    if n_prompt <= 0:
        return (), ()
    user_set = set(users)
    last_user = users[-1] if users else -1
    image_end = {s.start: s.end for s in spans}
    in_image = set()
    for s in spans:
        in_image.update(range(s.start, s.end))
    cuts, checkpoints = [], []
    n = 0
    while n < n_prompt:
        has_mtmd = False
        while n < n_prompt and n in image_end:          # images go through mtmd first
            n, has_mtmd = image_end[n], True
        start = n
        while n < n_prompt and n - start < n_batch and n not in in_image:
            n += 1
            if n in user_set and (n == last_user or not checkpoints or n > checkpoints[-1] + min_step):
                cuts.append(n)
                break
            if any(n_prompt == n + min(n_batch, off) for off in CHECKPOINT_OFFSETS):
                break
        if n == start:
            continue
        near_end = n_prompt < n + n_ubatch
        take = n == n_prompt or start in user_set or near_end
        take = take and start > 0 and not has_mtmd       # memory empty: nothing to save
        take = take and (not checkpoints or start == last_user or near_end or start > checkpoints[-1] + min_step)
        if take:
            checkpoints.append(start)
    return tuple(cuts), tuple(checkpoints)


def turn_cuts(prompt: list[int], spans, delimiters, min_step: int = CHECKPOINT_MIN_STEP) -> tuple[int, ...]:
    """The user-message starts where llama-server ends a batch of this chat prompt
    (models with context checkpoints; () without delimiters), with --checkpoint-min-step
    min_step."""
    if not delimiters:
        return ()
    users = user_starts(prompt, spans, delimiters)
    return batch_cuts(len(prompt), spans, users, min_step=min_step)[0] if users else ()
