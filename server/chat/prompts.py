"""Rendered chat text (+ images) -> the prompt the engine runs.

Owned by the service (server/service/service.py), which runs it on its own worker thread:
it reads only what never changes after loading (tokenizer, chat template, the
vision model's preprocessing), never the engine's state.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import numpy as np

from ggserve.models.audio.decode import Clip
from ggserve.models.vision.arrange import MEDIA_MARKER, arrange, mrope_positions
from ggserve.server.chat.turns import CHECKPOINT_MIN_STEP, tokenized_delimiters, turn_cuts
from ggserve.server.request_errors import AudioNotSupported, ImagesNotSupported

# Image parts of a chat render as this per-process random marker, so text a user
# types (a literal "<__media__>" included) can never stand for an image.
CHAT_MARKER = f"<__media_{secrets.token_hex(16)}__>"


@dataclass
class Prompt:
    tokens: list[int]
    images: list = field(default_factory=list)   # TileSpans: image rows within `tokens`
    turn_starts: tuple = ()                      # batch cuts at user messages: server/chat/turns.py
    text: str = ""                               # the rendered chat text (chat prompts)
    # int32 [n_pos, len(tokens)] where positions are not token indices (M-RoPE images), else None
    positions: np.ndarray | None = None


class PromptBuilder:
    def __init__(self, tokenizer, chat_template, vision=None, delimiters=(), audio=None,
                 checkpoint_min_step: int = CHECKPOINT_MIN_STEP):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.vision = vision
        self.audio = audio                     # models/audio AudioModel, or None
        self.delimiters = list(delimiters)     # (role, tokens): llama-server's message delimiters
        self.min_step = checkpoint_min_step    # --checkpoint-min-step: which user turns end a batch

    @classmethod
    def for_engine(cls, engine) -> "PromptBuilder":
        delimiters = (tokenized_delimiters(engine.chat_template, engine.tokenizer)
                      if engine.parity.cuts_at_user_turns else [])
        return cls(engine.tokenizer, engine.chat_template, engine.vision, delimiters, engine.loaded.audio,
                   engine.cfg.checkpoint_min_step)

    def check_images(self, n_images: int) -> None:
        """Refuse images up front (before fetching them) when the model has no projector."""
        if n_images and self.vision is None:
            raise ImagesNotSupported("this model does not support images (start the server with --mmproj)")

    def check_audio(self, n_clips: int) -> None:
        """Refuse audio up front (before decoding it) when the mmproj has no audio encoder."""
        if n_clips and self.audio is None:
            raise AudioNotSupported("this model does not support audio input (start the server with an --mmproj "
                                    "that has an audio encoder)")

    def chat(self, messages: list[dict], tools=None, images: list = (), *,
             template_kwargs: dict | None = None, continue_final: bool = False,
             add_generation_prompt: bool = True) -> Prompt:
        """Chat messages (image parts as media markers) -> Prompt. continue_final:
        the last (assistant) message is left open for the model to continue."""
        text = render_chat(self.chat_template, messages, tools, template_kwargs=template_kwargs,
                           continue_final=continue_final, add_generation_prompt=add_generation_prompt)
        prompt = self.build(text, images, marker=CHAT_MARKER)
        prompt.text = text.replace(CHAT_MARKER, MEDIA_MARKER)    # as shown (/apply-template)
        bos = self.tokenizer.bos_id
        ids = prompt.tokens
        # a template that writes the BOS text itself, plus add_special: one BOS only
        if not prompt.images and len(ids) >= 2 and bos is not None and ids[0] == bos and ids[1] == bos:
            prompt = Prompt(ids[1:], [], turn_cuts(ids[1:], (), self.delimiters, self.min_step), text)
        return prompt

    def build(self, text: str, images: list = (), marker: str = MEDIA_MARKER) -> Prompt:
        """Rendered chat text with one media marker per image -> Prompt.

        images: (sha256, PIL image or audio Clip) pairs in marker order (chats use CHAT_MARKER,
        which user text cannot contain). Without images the text is tokenized as llama-server does (BOS per the model, special tokens parsed).
        """
        parts = text.split(marker)
        if len(parts) - 1 != len(images):
            raise ValueError(f"the prompt has {len(parts) - 1} image markers for {len(images)} images")
        if not images:
            ids = self.tokenizer.encode(text, add_special=True, parse_special=True)
            return Prompt(ids, [], turn_cuts(ids, (), self.delimiters, self.min_step))
        clips = sum(isinstance(media, Clip) for _, media in images)
        self.check_images(len(images) - clips)
        self.check_audio(clips)
        pieces = [parts[0]]
        for (sha, media), after in zip(images, parts[1:]):
            if isinstance(media, Clip):
                pieces.append((sha, self.audio.preprocess(media.samples)))
            else:
                pieces.append((sha, self.vision.preprocess(media)))
            pieces.append(after)
        vision = self.vision
        ids, spans = arrange(vision.projector if vision else "", self.tokenizer, pieces,
                             vision.tokens_per_tile if vision else 0, vision.family if vision else None)
        if any(span.grid is not None for span in spans):    # M-RoPE: images advance positions by their grid
            return Prompt(ids, spans, turn_cuts(ids, spans, self.delimiters, self.min_step),
                          positions=mrope_positions(len(ids), spans))
        return Prompt(ids, spans, turn_cuts(ids, spans, self.delimiters, self.min_step))


def render_chat(template, messages: list[dict], tools=None, *, template_kwargs: dict | None = None,
                continue_final: bool = False, add_generation_prompt: bool = True,
                image_marker: str = CHAT_MARKER) -> str:
    """The chat's prompt text as the template renders it (images as image_marker)."""
    extra = dict(template_kwargs or {})
    if continue_final:
        extra["continue_final_message"] = True
    return template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                           image_marker=image_marker, **extra)
