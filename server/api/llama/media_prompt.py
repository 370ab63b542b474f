"""llama-server's multimodal JSON prompt for /completion:
`{"prompt_string": "... <__media__> ...", "multimodal_data": [base64, ...]}`, one media marker
per file, each an image or an audio clip (WAV, MP3, FLAC, found by its magic bytes as mtmd
finds it) -> the Prompt the engine runs (ref: llama.cpp tools/server/server-common.cpp,
tokenize_input_subprompt; mtmd-helper.cpp, mtmd_helper_bitmap_init_from_buf)."""
from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib

from ggserve.models.audio.decode import sniff
from ggserve.models.vision.arrange import MEDIA_MARKER
from ggserve.server.api.errors import invalid
from ggserve.server.api.media import MediaError, decode_image
from ggserve.server.api.media_parts import decode_clip
from ggserve.server.chat.prompts import Prompt
from ggserve.server.request_errors import ImagesNotSupported


def is_media_prompt(p) -> bool:
    return isinstance(p, dict) and "multimodal_data" in p


def _media(api, files: list, param: str) -> list:
    """Each base64 file -> (sha256, PIL image | audio Clip), decoded as mtmd's helper decodes it."""
    out = []
    for i, b64 in enumerate(files):
        where = f"{param}.multimodal_data.{i}"
        if not isinstance(b64, str):
            raise invalid("multimodal_data holds base64 strings", param=where)
        try:
            data = base64.b64decode("".join(b64.split()), validate=True)
        except (binascii.Error, ValueError):
            raise invalid("invalid base64 in multimodal_data", param=where) from None
        sha = hashlib.sha256(data).hexdigest()
        if sniff(data) is not None:
            api.service.prompts.check_audio(1)
            out.append((sha, decode_clip(data, api.media, api.service.prompts.audio.sample_rate, where)))
            continue
        try:
            api.service.prompts.check_images(1)
        except ImagesNotSupported as e:     # llama-server names the field
            raise ImagesNotSupported(f"multimodal_data: {e}") from None
        try:
            out.append((sha, decode_image(data, api.media).image))
        except MediaError as e:
            raise e.api_error(where) from None
    return out


async def media_prompt(api, p: dict, param: str = "prompt") -> Prompt:
    text, files = p.get("prompt_string"), p.get("multimodal_data")
    if not isinstance(text, str) or not isinstance(files, list):
        raise invalid("a multimodal prompt needs prompt_string (a string) and multimodal_data (a list)", param=param)
    media = await asyncio.to_thread(_media, api, files, param)
    try:
        return await asyncio.to_thread(api.service.prompts.build, text, media, MEDIA_MARKER)
    except ValueError as e:
        raise invalid(f"multimodal_data: {e}", param=param) from None
