"""Turn an OpenAI `image_url` content part into a decoded RGB image, safely.

`load_image(url, config)` accepts `data:` URLs (base64) and, when allowed, http(s) URLs;
`decode_image(data, config)` decodes bytes. Both raise `MediaError` (HTTP 400 with an OpenAI
error code) for anything a client got wrong or a fetch that failed.

Pixels follow llama.cpp's mtmd helper, which decodes with `stbi_load_from_memory(..., 3)`:
alpha is dropped without compositing, grey is replicated, 16-bit samples keep their high
byte, a GIF's first frame is used (its transparent pixels are black, as stb leaves them),
EXIF orientation and ICC profiles are ignored. JPEG pixels can differ from stb's by a few
levels (libjpeg vs stb's IDCT/upsampling); PNG, GIF and BMP are identical.

Safety: the encoded size is limited (data: after base64 decoding, HTTP while streaming),
the pixel count is checked from the header before any pixel is decoded, only the formats
below are ever parsed, truncated files are errors, and fetches refuse loopback/private/
link-local/reserved addresses (every resolved address, every redirect hop, and again at
connect time when this module owns the HTTP client) unless `allow_private` is set.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
from dataclasses import dataclass, field

import httpx
import numpy as np
from PIL import Image

__all__ = ["MediaConfig", "MediaError", "LoadedImage", "load_image", "decode_image",
           "SUPPORTED_MIME_TYPES"]

# Pillow format name -> canonical mime type. Image.open is only ever asked to try these.
_FORMAT_MIME = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "MPO": "image/jpeg",    # camera JPEGs with a multi-picture extension; first picture
    "WEBP": "image/webp",
    "GIF": "image/gif",
    "BMP": "image/bmp",
    "TIFF": "image/tiff",
}
_PIL_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")   # JPEG may yield MPO

# accepted spellings of the mime type -> canonical
_MIME_ALIASES = {
    "image/png": "image/png", "image/x-png": "image/png", "image/apng": "image/png",
    "image/jpeg": "image/jpeg", "image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg",
    "image/webp": "image/webp",
    "image/gif": "image/gif",
    "image/bmp": "image/bmp", "image/x-bmp": "image/bmp", "image/x-ms-bmp": "image/bmp",
    "image/tiff": "image/tiff", "image/tif": "image/tiff",
}
SUPPORTED_MIME_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif", "image/bmp",
                        "image/tiff")

@dataclass
class MediaConfig:
    max_bytes: int = 20 * 2**20          # encoded size limit (data: URL after base64 decode, or HTTP body)
    max_pixels: int = 50_000_000         # width*height, checked from the header before decoding
    fetch_enabled: bool = True           # http(s) URLs allowed at all
    fetch_timeout: float = 10.0          # seconds for the whole fetch (all hops, headers and body)
    max_redirects: int = 3
    allowed_domains: list[str] | None = None   # if set, only these hosts (and their subdomains)
    allow_private: bool = False          # loopback/private/link-local/... addresses allowed
    audio_max_seconds: float = 1800.0    # longest input_audio clip (--audio-max-seconds)
    audio_max_bytes: int = 48 * 2**20      # largest encoded clip (--audio-max-bytes): base64 in a 64 MiB body


class MediaError(ValueError):
    """A client-visible image error: `status` (400), OpenAI-style `code`, optional `param`."""

    def __init__(self, message: str, code: str = "invalid_image", *, status: int = 400,
                 param: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.param = param

    def api_error(self, param: str | None = None):
        """The matching `server.errors.APIError` (OpenAI's error shape)."""
        from ggserve.server.api.errors import APIError
        return APIError(self.status, self.message, param=param or self.param, code=self.code)


@dataclass
class LoadedImage:
    image: Image.Image   # fully decoded, mode RGB
    data: bytes          # the encoded bytes
    sha256: str          # hex digest of `data`
    mime: str            # canonical mime type of the detected format
    width: int = field(init=False)
    height: int = field(init=False)

    def __post_init__(self):
        self.width, self.height = self.image.size


# -- decoding -----------------------------------------------------------------------------

def _canonical_mime(mime: str) -> str:
    m = _MIME_ALIASES.get(mime.strip().lower())
    if m is None:
        raise MediaError(
            f"Unsupported image type {mime!r}; supported: {', '.join(SUPPORTED_MIME_TYPES)}.",
            "unsupported_image_type")
    return m


def _human(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def decode_image(data: bytes, config: MediaConfig, declared_mime: str | None = None) -> LoadedImage:
    """Decode encoded image bytes into an RGB image with stb_image's semantics.

    `declared_mime` (from a data: URL) must be a supported image type and match the format
    found in the bytes. Raises MediaError.
    """
    want = _canonical_mime(declared_mime) if declared_mime is not None else None
    if len(data) > config.max_bytes:
        raise MediaError(f"Image is {_human(len(data))}, larger than the limit of "
                         f"{_human(config.max_bytes)}.", "image_too_large")
    if not data:
        raise MediaError("Image data is empty.", "invalid_image")
    try:
        img = Image.open(io.BytesIO(data), formats=_PIL_FORMATS)
    except Image.DecompressionBombError:
        raise MediaError("Image has too many pixels (Pillow's decompression-bomb limit).",
                         "image_too_large") from None
    except MemoryError:
        raise
    except Image.UnidentifiedImageError:
        raise MediaError("Could not decode the image: the data is not a supported image "
                         f"({', '.join(SUPPORTED_MIME_TYPES)}).", "invalid_image") from None
    except Exception as e:  # noqa: BLE001 - any parser failure is the client's bad data
        raise MediaError(f"Could not decode the image: {e}", "invalid_image") from None
    with img:
        mime = _FORMAT_MIME.get(img.format)
        if mime is None:
            raise MediaError(f"Unsupported image format {img.format}.", "unsupported_image_type")
        if want is not None and want != mime:
            raise MediaError(f"The image is declared as {want} but the data is {mime}.",
                             "invalid_image")
        w, h = img.size
        if w <= 0 or h <= 0:
            raise MediaError(f"Image has an invalid size {w}x{h}.", "invalid_image")
        if w * h > config.max_pixels:
            raise MediaError(f"Image is {w}x{h} = {w * h} pixels, more than the limit of "
                             f"{config.max_pixels}.", "image_too_large")
        gif_extent = None
        if img.format == "GIF" and img.tile:
            gif_extent = tuple(img.tile[0][1])
        try:
            img.load()   # first frame only; truncated data raises (LOAD_TRUNCATED_IMAGES unset)
            rgb = _to_rgb(img, gif_extent)
        except (MediaError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001
            raise MediaError(f"Could not decode the image: {e}", "invalid_image") from None
    return LoadedImage(image=rgb, data=data, sha256=hashlib.sha256(data).hexdigest(), mime=mime)


def _to_rgb(img: Image.Image, gif_extent: tuple[int, int, int, int] | None = None) -> Image.Image:
    """RGB pixels as `stbi_load(..., 3)` returns them."""
    mode = img.mode
    if mode == "RGB":
        return img.copy()
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        # stb keeps the high byte of 16-bit samples (Pillow's own conversion clips)
        a = np.asarray(img)
        g = np.clip(a.astype(np.int64) >> 8, 0, 255).astype(np.uint8)
        return Image.fromarray(np.repeat(g[:, :, None], 3, axis=2), "RGB")
    if img.format == "GIF" and mode in ("P", "L"):
        return _gif_to_rgb(img, gif_extent)
    if mode in ("P", "PA"):
        # palette expanded with its alpha, then alpha dropped: the palette colours
        return img.convert("RGBA").convert("RGB")
    if mode == "F":
        return img.convert("L").convert("RGB")
    # RGBA/RGBX/LA drop alpha without compositing; L/1 replicate; CMYK/YCbCr/LAB convert
    return img.convert("RGB")


def _gif_to_rgb(img: Image.Image, extent: tuple[int, int, int, int] | None) -> Image.Image:
    """A GIF's first frame as stb renders it onto a (0,0,0,0) canvas."""
    rgba = np.array(img.convert("RGBA"))
    rgb = np.ascontiguousarray(rgba[:, :, :3])
    if "transparency" in img.info:
        rgb[rgba[:, :, 3] == 0] = 0          # transparent pixels are not drawn: stay black
    if extent is not None:
        x0, y0, x1, y1 = extent
        outside = np.ones(rgb.shape[:2], dtype=bool)
        outside[max(y0, 0):max(y1, 0), max(x0, 0):max(x1, 0)] = False
        if outside.any():
            # stb fills pixels the first frame does not cover with the background colour when
            # the background index is > 0 (else they stay black); it copies its palette entry,
            # stored B,G,R, as is - so the background colour comes out channel-swapped
            bg = img.info.get("background", 0)
            pal = getattr(img, "global_palette", None)
            raw = pal.palette if pal is not None else b""
            if isinstance(bg, int) and bg > 0 and len(raw) >= 3 * bg + 3:
                r, g, b = raw[3 * bg:3 * bg + 3]
                rgb[outside] = (b, g, r)
            else:
                rgb[outside] = 0
    return Image.fromarray(rgb, "RGB")


# -- URLs ---------------------------------------------------------------------------------

def _decode_data_url(url: str, config: MediaConfig) -> tuple[bytes, str]:
    head, sep, payload = url.partition(",")
    if not sep:
        raise MediaError("Invalid data URL: no ',' separates the header from the data.",
                         "invalid_image")
    params = [p.strip() for p in head[len("data:"):].split(";")]
    mime = params[0] or "text/plain"     # RFC 2397's default
    mime = _canonical_mime(mime)
    if "base64" not in (p.lower() for p in params[1:]):
        raise MediaError("Invalid data URL: image data must be base64-encoded "
                         "(data:image/png;base64,...).", "invalid_image")
    # tolerate line breaks/spaces and missing '=' padding; reject anything else
    b64 = "".join(payload.split())
    if len(b64) // 4 * 3 > config.max_bytes + 3:
        raise MediaError(f"Image is about {_human(len(b64) // 4 * 3)}, larger than the limit "
                         f"of {_human(config.max_bytes)}.", "image_too_large")
    if len(b64) % 4:
        b64 += "=" * (-len(b64) % 4)
    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("Invalid base64 data in the image data URL.", "invalid_image") from None
    return data, mime


async def load_image(url: str, config: MediaConfig,
                     client: httpx.AsyncClient | None = None) -> LoadedImage:
    """Decode an `image_url.url` value: a base64 data: URL or (if enabled) an http(s) URL.

    `client`, if given, is used for fetches (its own transport/proxy settings apply; the
    per-hop address checks still run). Decoding runs in a worker thread.
    """
    if not isinstance(url, str) or not url:
        raise MediaError("image_url.url must be a non-empty string.", "invalid_image_url")
    scheme = url.split(":", 1)[0].strip().lower() if ":" in url else ""
    if scheme == "data":
        def work():
            data, mime = _decode_data_url(url, config)
            return decode_image(data, config, mime)
        return await asyncio.to_thread(work)
    if scheme not in ("http", "https"):
        raise MediaError("Unsupported image URL: use a data:image/...;base64 URL"
                         + (" or an http(s) URL." if config.fetch_enabled else "."),
                         "invalid_image_url")
    if not config.fetch_enabled:
        raise MediaError("Fetching images from URLs is disabled on this server; send the "
                         "image as a base64 data: URL.", "invalid_image_url")
    from ggserve.server.api.media_fetch import fetch  # network code only where a URL is fetched
    data, content_type = await fetch(url, config, client)
    declared = None
    if content_type:
        ct = content_type.split(";", 1)[0].strip().lower()
        # servers often send application/octet-stream: only an image/* type is checked
        if ct.startswith("image/"):
            declared = ct
    return await asyncio.to_thread(decode_image, data, config, declared)
