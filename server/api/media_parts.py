"""A request's media parts (`image_url` images, `input_audio` clips) -> what the prompt
builder takes: (sha256 of the bytes, PIL image or decoded audio Clip) in prompt order.

`input_audio` is OpenAI's part, `{"data": base64, "format": "wav" | "mp3"}`; as llama-server
11434 we take FLAC too, find the container by its magic bytes (a `format` we do not know is
refused, a known one is not checked against the bytes), and accept a base64 `data:` URL in
`url` instead of `data`. Clips decode as llama.cpp's mtmd decodes them (models/audio/decode.py).
Every failure is a 400 naming the part.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib

from ggserve.models.audio.decode import FORMATS, AudioError, Clip, decode, sniff
from ggserve.server.api.errors import APIError, invalid
from ggserve.server.api.media import MediaError, load_image


async def load_media(api, sources: list[tuple[object, str]]) -> list[tuple[str, object]]:
    """sources: (image URL str | input_audio dict, param) in prompt order. Models without the
    encoder a part needs are refused before anything is fetched or decoded."""
    n_audio = sum(isinstance(s, dict) for s, _ in sources)
    api.service.prompts.check_images(len(sources) - n_audio)
    api.service.prompts.check_audio(n_audio)
    out = []
    for source, param in sources:
        if isinstance(source, dict):
            rate = api.service.prompts.audio.sample_rate
            out.append(await asyncio.to_thread(load_audio, source, api.media, rate, param))
            continue
        try:
            loaded = await load_image(source, api.media)
        except MediaError as e:
            raise e.api_error(param) from None
        out.append((loaded.sha256, loaded.image))
    return out


def audio_bytes(part: dict, max_bytes: int, param: str) -> bytes:
    """The encoded bytes of an input_audio part."""
    fmt = part.get("format")
    if fmt is not None and (not isinstance(fmt, str) or fmt.lower() not in FORMATS):
        raise invalid(f"Unsupported audio format {fmt!r}; supported: {', '.join(FORMATS)}.", param=param,
                      code="unsupported_audio_format")
    data = part.get("data")
    if data is None and isinstance(part.get("url"), str):
        head, sep, data = part["url"].partition(",")
        if not (sep and head.lower().startswith("data:") and "base64" in head.lower()):
            raise invalid("input_audio.url must be a base64 data: URL.", param=param, code="invalid_audio")
    if not isinstance(data, str) or not data:
        raise invalid("input_audio needs `data`: the base64-encoded audio file.", param=param, code="invalid_audio")
    b64 = "".join(data.split())
    if len(b64) // 4 * 3 > max_bytes + 3:
        raise invalid(f"Audio is about {len(b64) // 4 * 3} bytes, more than the limit of {max_bytes} "
                      "(--audio-max-bytes).", param=param, code="audio_too_large")
    try:
        return base64.b64decode(b64 + "=" * (-len(b64) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid("Invalid base64 data in input_audio.", param=param, code="invalid_audio") from None


def load_audio(part, config, rate: int, param: str) -> tuple[str, Clip]:
    """An input_audio part -> (sha256 of its bytes, the decoded clip). APIError (400) if bad."""
    if not isinstance(part, dict):
        raise invalid("input_audio must be an object with `data` and `format`.", param=param, code="invalid_audio")
    data = audio_bytes(part, config.audio_max_bytes, param)
    return hashlib.sha256(data).hexdigest(), decode_clip(data, config, rate, param)


def decode_clip(data: bytes, config, rate: int, param: str) -> Clip:
    """Encoded audio bytes -> Clip, within --audio-max-bytes and --audio-max-seconds."""
    if len(data) > config.audio_max_bytes:
        raise invalid(f"Audio is {len(data)} bytes, more than the limit of {config.audio_max_bytes} "
                      "(--audio-max-bytes).", param=param, code="audio_too_large")
    if sniff(data) is None:
        raise invalid("The audio is not a WAV, MP3 or FLAC file.", param=param, code="invalid_audio")
    try:
        clip = Clip(decode(data, rate), rate)
    except AudioError as e:
        raise invalid(f"Could not decode the audio: {e}.", param=param, code="invalid_audio") from None
    if clip.seconds > config.audio_max_seconds:
        raise APIError(400, f"The audio is {clip.seconds:.1f} s long, more than the limit of "
                       f"{config.audio_max_seconds:g} s (--audio-max-seconds).", param=param, code="audio_too_long")
    return clip
