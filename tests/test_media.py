"""server/api/media.py: image_url parts -> decoded RGB images, with limits and fetch safety.

Images are built with Pillow here (exact pixels known); the JPEG golden pair in
tests/data/media/ is llama.cpp's stb_image decode of the same file. Fetch tests run against
a local http.server on 127.0.0.1 (loopback, so they set allow_private=True, except the
tests that check loopback is refused).
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import socket
import struct
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
from PIL import Image

from ggserve.server.api.media import LoadedImage, MediaConfig, MediaError, decode_image, load_image
from ggserve.server.api.media_fetch import _address_refused, _GuardedBackend, _host_allowed

DATA = os.path.join(os.path.dirname(__file__), "data", "media")
CFG = MediaConfig()


# -- helpers ------------------------------------------------------------------------------

def enc(im: Image.Image, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def pixels(img: Image.Image) -> np.ndarray:
    assert img.mode == "RGB"
    return np.asarray(img)


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_header_only(w: int, h: int, idat: bytes = b"") -> bytes:
    """A PNG that claims w x h (8-bit RGB) but carries `idat` (default: no pixel data)."""
    out = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    if idat:
        out += png_chunk(b"IDAT", idat)
    return out + png_chunk(b"IEND", b"")


RNG = np.random.default_rng(1234)
RGB = RNG.integers(0, 256, (12, 16, 3), dtype=np.uint8)          # 16x12 noise
RGBA = np.concatenate([RGB, RNG.integers(0, 256, (12, 16, 1), dtype=np.uint8)], axis=2)
RGBA[0, 0] = (10, 20, 30, 0)                                      # fully transparent
RGBA[0, 1] = (200, 100, 50, 128)
# a palette image whose colours survive every format exactly
PALETTE = np.array([[0, 0, 0], [255, 0, 0], [0, 255, 0], [0, 0, 255], [12, 34, 56], [250, 251, 252]],
                   dtype=np.uint8)
IDX = RNG.integers(0, len(PALETTE), (12, 16))
PAL_RGB = PALETTE[IDX]


def p_image() -> Image.Image:
    im = Image.fromarray(IDX.astype(np.uint8), "P")
    im.putpalette(PALETTE.flatten().tolist())
    return im


async def load(data: bytes, mime: str, cfg: MediaConfig = CFG) -> LoadedImage:
    return await load_image(data_url(data, mime), cfg)


async def media_error(url: str, cfg: MediaConfig = CFG, **kw) -> MediaError:
    with pytest.raises(MediaError) as ei:
        await load_image(url, cfg, **kw)
    assert ei.value.status == 400
    return ei.value


# -- formats ------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,mime,kw", [
    ("PNG", "image/png", {}),
    ("WEBP", "image/webp", {"lossless": True}),
    ("BMP", "image/bmp", {}),
    ("TIFF", "image/tiff", {}),
    ("TIFF", "image/tiff", {"compression": "tiff_lzw"}),
])
async def test_lossless_formats_decode_exactly(fmt, mime, kw):
    data = enc(Image.fromarray(RGB), fmt, **kw)
    out = await load(data, mime)
    assert out.mime == mime and out.data == data
    assert out.sha256 == hashlib.sha256(data).hexdigest()
    assert (out.width, out.height) == (16, 12)
    np.testing.assert_array_equal(pixels(out.image), RGB)


async def test_gif_decodes_palette_colours():
    data = enc(p_image(), "GIF")
    out = await load(data, "image/gif")
    assert out.mime == "image/gif"
    np.testing.assert_array_equal(pixels(out.image), PAL_RGB)


async def test_animated_gif_uses_first_frame():
    second = Image.fromarray((IDX[::-1] % len(PALETTE)).astype(np.uint8), "P")
    second.putpalette(PALETTE.flatten().tolist())
    data = enc(p_image(), "GIF", save_all=True, append_images=[second], duration=100, loop=0)
    assert Image.open(io.BytesIO(data)).n_frames == 2
    out = await load(data, "image/gif")
    np.testing.assert_array_equal(pixels(out.image), PAL_RGB)


async def test_jpeg_decodes_like_pillow():
    y, x = np.mgrid[0:48, 0:64]
    smooth = np.stack([x * 4, y * 5, (x + y) * 2], axis=2).astype(np.uint8)
    data = enc(Image.fromarray(smooth), "JPEG", quality=95)
    out = await load(data, "image/jpeg")
    assert out.mime == "image/jpeg"
    np.testing.assert_array_equal(pixels(out.image), np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    # and close to the source (lossy)
    assert np.abs(pixels(out.image).astype(int) - smooth).mean() < 3


async def test_image_jpg_alias_and_mime_case():
    data = enc(Image.fromarray(RGB), "JPEG")
    assert (await load_image(data_url(data, "IMAGE/JPG"), CFG)).mime == "image/jpeg"


async def test_jpeg_matches_llama_cpp_stb_decode_within_3_levels():
    with open(os.path.join(DATA, "checker_300x200.jpg"), "rb") as f:
        data = f.read()
    stb = np.asarray(Image.open(os.path.join(DATA, "checker_300x200.jpg.stb.png")).convert("RGB"))
    out = await load(data, "image/jpeg")
    ours = pixels(out.image)
    assert ours.shape == stb.shape == (200, 300, 3)
    # libjpeg vs stb's IDCT/upsampling: documented difference of up to 3 levels
    assert np.abs(ours.astype(int) - stb.astype(int)).max() <= 3


# -- stb_image channel semantics --------------------------------------------------------------

@pytest.mark.parametrize("fmt,mime,kw", [
    ("PNG", "image/png", {}),
    ("WEBP", "image/webp", {"lossless": True, "exact": True}),
    ("TIFF", "image/tiff", {}),
    ("BMP", "image/bmp", {}),
])
async def test_rgba_alpha_dropped_without_compositing(fmt, mime, kw):
    data = enc(Image.fromarray(RGBA, "RGBA"), fmt, **kw)
    if fmt != "BMP":                # Pillow reads a 32-bit BMP back as RGB (alpha ignored, as stb)
        assert Image.open(io.BytesIO(data)).mode == "RGBA"
    px = pixels((await load(data, mime)).image)
    assert tuple(px[0, 0]) == (10, 20, 30)        # alpha 0: colour kept, not blended to black/white
    assert tuple(px[0, 1]) == (200, 100, 50)
    np.testing.assert_array_equal(px, RGBA[:, :, :3])


async def test_grayscale_replicated():
    g = RGB[:, :, 0].copy()
    px = pixels((await load(enc(Image.fromarray(g, "L"), "PNG"), "image/png")).image)
    np.testing.assert_array_equal(px, np.repeat(g[:, :, None], 3, axis=2))


async def test_gray_alpha_drops_alpha():
    la = np.stack([RGB[:, :, 0], np.zeros_like(RGB[:, :, 0])], axis=2)
    px = pixels((await load(enc(Image.fromarray(la, "LA"), "PNG"), "image/png")).image)
    np.testing.assert_array_equal(px, np.repeat(la[:, :, :1], 3, axis=2))


async def test_16bit_gray_keeps_high_byte():
    a = np.array([[0x0000, 0x00FF, 0x0100], [0x1234, 0x8000, 0xFFFF]], dtype=np.uint16)
    data = enc(Image.fromarray(a), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    px = pixels((await load(data, "image/png")).image)
    np.testing.assert_array_equal(px[:, :, 0], [[0x00, 0x00, 0x01], [0x12, 0x80, 0xFF]])
    assert (px[:, :, 0] == px[:, :, 1]).all() and (px[:, :, 0] == px[:, :, 2]).all()


async def test_palette_png_with_transparency_keeps_palette_colours():
    data = enc(p_image(), "PNG", transparency=4)      # index 4 = (12,34,56) fully transparent
    px = pixels((await load(data, "image/png")).image)
    np.testing.assert_array_equal(px, PAL_RGB)


async def test_gif_transparent_pixels_are_black_like_stb():
    # stb draws a GIF onto a (0,0,0,0) canvas and skips transparent pixels
    data = enc(p_image(), "GIF", transparency=4)
    px = pixels((await load(data, "image/gif")).image)
    expect = PAL_RGB.copy()
    expect[IDX == 4] = 0
    assert (IDX == 4).any()
    np.testing.assert_array_equal(px, expect)


@pytest.mark.parametrize("bg,fill", [(0, (0, 0, 0)), (5, (252, 251, 250))])
async def test_gif_small_first_frame_filled_like_stb(bg, fill):
    # logical screen 20x16, first frame 16x12 at (0,0): stb fills the rest with the
    # background colour when its index is > 0 - B/R swapped (its palette is stored BGR) -
    # else black. Expected values checked against llama.cpp's stb_image.
    gif = bytearray(enc(p_image(), "GIF", background=bg))
    gif[6:10] = struct.pack("<HH", 20, 16)
    px = pixels((await load(bytes(gif), "image/gif")).image)
    assert px.shape == (16, 20, 3)
    np.testing.assert_array_equal(px[:12, :16], PAL_RGB)
    assert (px[12:, :] == fill).all() and (px[:, 16:] == fill).all()


async def test_cmyk_jpeg_converted_to_rgb():
    data = enc(Image.fromarray(RGB).convert("CMYK"), "JPEG", quality=95)
    out = await load(data, "image/jpeg")
    np.testing.assert_array_equal(pixels(out.image),
                                  np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


def test_decode_image_sync_api():
    data = enc(Image.fromarray(RGB), "PNG")
    out = decode_image(data, CFG)                    # no declared mime: sniffed
    assert out.mime == "image/png" and out.image.mode == "RGB"
    np.testing.assert_array_equal(np.asarray(out.image), RGB)


# -- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "data:image/png;base64,@@@not base64!!!",
    "data:image/png;base64,iVBORw0KGgo=AAAA",         # data after padding
    "data:image/png;base64,A",                         # impossible length
])
async def test_bad_base64(url):
    e = await media_error(url)
    assert e.code == "invalid_image" and "base64" in str(e)


async def test_base64_whitespace_and_missing_padding_tolerated():
    data = enc(Image.fromarray(RGB), "PNG")
    b64 = base64.b64encode(data).decode().rstrip("=")
    wrapped = "\n".join(b64[i:i + 76] for i in range(0, len(b64), 76))
    out = await load_image("data:image/png;base64," + wrapped, CFG)
    np.testing.assert_array_equal(pixels(out.image), RGB)


async def test_data_url_not_base64_or_malformed():
    e = await media_error("data:image/png,%89PNG")
    assert e.code == "invalid_image" and "base64" in str(e)
    e = await media_error("data:image/png;base64")
    assert e.code == "invalid_image"


@pytest.mark.parametrize("mime", ["text/plain", "image/svg+xml", "application/octet-stream", "image/avif", ""])
async def test_unsupported_mime(mime):
    e = await media_error(data_url(enc(Image.fromarray(RGB), "PNG"), mime))
    assert e.code == "unsupported_image_type"


async def test_declared_mime_must_match_the_data():
    e = await media_error(data_url(enc(Image.fromarray(RGB), "PNG"), "image/jpeg"))
    assert e.code == "invalid_image"
    assert "image/jpeg" in str(e) and "image/png" in str(e)


@pytest.mark.parametrize("blob", [b"hello world, not an image", b"\x89PNG\r\n\x1a\n garbage", b""])
async def test_undecodable_bytes(blob):
    e = await media_error(data_url(blob, "image/png"))
    assert e.code == "invalid_image"


def test_formats_outside_the_list_are_not_parsed():
    # Pillow can read these, but they are not on the list: never handed to their parsers
    for fmt in ("PPM", "TGA", "ICO", "PCX"):
        data = enc(Image.fromarray(RGB), fmt)
        with pytest.raises(MediaError) as ei:
            decode_image(data, CFG)
        assert ei.value.code == "invalid_image"


@pytest.mark.parametrize("fmt,mime", [("PNG", "image/png"), ("JPEG", "image/jpeg")])
async def test_truncated(fmt, mime):
    noise = RNG.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    data = enc(Image.fromarray(noise), fmt)
    e = await media_error(data_url(data[: len(data) // 2], mime))
    assert e.code == "invalid_image" and "truncated" in str(e).lower()


async def test_pixel_bomb_header_rejected():
    # 100000 x 100000 RGB claimed in 100 bytes (Pillow's own bomb check trips here too)
    bomb = png_header_only(100_000, 100_000, zlib.compress(b"\0" * 1000))
    assert len(bomb) < 200
    e = await media_error(data_url(bomb, "image/png"))
    assert e.code == "image_too_large"


async def test_pixel_limit_checked_from_header_before_decoding():
    # 8000x8000 = 64M > 50M default, below Pillow's own bomb threshold: our check rejects it.
    # The file has no pixel data at all: if it were decoded it would fail as truncated.
    hdr = png_header_only(8000, 8000)
    e = await media_error(data_url(hdr, "image/png"))
    assert e.code == "image_too_large" and "8000x8000" in str(e)
    e = await media_error(data_url(hdr, "image/png"), MediaConfig(max_pixels=10**8))
    assert e.code == "invalid_image"       # with the limit raised it is decoded, and fails


async def test_pixel_limit_is_width_times_height():
    cfg = MediaConfig(max_pixels=16 * 12)
    assert (await load(enc(Image.fromarray(RGB), "PNG"), "image/png", cfg)).width == 16
    bigger = np.zeros((12, 17, 3), np.uint8)
    e = await media_error(data_url(enc(Image.fromarray(bigger), "PNG"), "image/png"), cfg)
    assert e.code == "image_too_large"


async def test_byte_limit_data_url():
    data = enc(Image.fromarray(RGB), "PNG")
    assert (await load(data, "image/png", MediaConfig(max_bytes=len(data)))).data == data
    e = await media_error(data_url(data, "image/png"), MediaConfig(max_bytes=len(data) - 1))
    assert e.code == "image_too_large"
    # far too large: refused from the base64 length, before decoding
    e = await media_error("data:image/png;base64," + "A" * 4000, MediaConfig(max_bytes=1000))
    assert e.code == "image_too_large"


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/a.png", "gopher://x/",
                                 "javascript:alert(1)", "/etc/passwd", "", "example.com/a.png"])
async def test_other_schemes_refused(url):
    e = await media_error(url)
    assert e.code == "invalid_image_url"


def test_media_error_to_api_error():
    err = MediaError("nope", "image_too_large", param="messages[0].content[1]")
    body = err.api_error().body()
    assert body == {"error": {"message": "nope", "type": "invalid_request_error",
                              "param": "messages[0].content[1]", "code": "image_too_large"}}
    assert err.api_error().status == 400 and isinstance(err, ValueError)


# -- address and domain checks ----------------------------------------------------------------

@pytest.mark.parametrize("addr", [
    "127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
    "0.0.0.0", "100.64.0.1", "224.0.0.1", "240.0.0.1", "255.255.255.255",
    "::1", "::", "fe80::1", "fc00::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
    "64:ff9b::7f00:1", "2002:7f00:1::1",
])
def test_non_public_addresses_refused(addr):
    assert _address_refused(addr) is not None


@pytest.mark.parametrize("addr", ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8",
                                  "64:ff9b::808:808"])
def test_public_addresses_allowed(addr):
    assert _address_refused(addr) is None


def test_allowed_domains_match_host_and_subdomains():
    allowed = ["example.com", "*.cdn.org", "IMG.Host.net."]
    for host in ("example.com", "a.example.com", "x.y.example.com", "EXAMPLE.COM.", "cdn.org",
                 "a.cdn.org", "img.host.net"):
        assert _host_allowed(host, allowed), host
    for host in ("badexample.com", "example.com.evil.net", "org", "host.net", "other.img.host.net.x"):
        assert not _host_allowed(host, allowed), host


# -- fetching (local server on 127.0.0.1) --------------------------------------------------

PNG_BYTES = enc(Image.fromarray(RGB), "PNG")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *a):
        pass

    def _send(self, body: bytes, ctype: str = "image/png", status: int = 200, length: bool = True):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.server.hits.append(self.path)
        path = self.path
        if path == "/img.png":
            self._send(PNG_BYTES)
        elif path == "/octet":
            self._send(PNG_BYTES, "application/octet-stream")
        elif path == "/mislabelled":
            self._send(PNG_BYTES, "image/jpeg")
        elif path == "/svg":
            self._send(b"<svg/>", "image/svg+xml")
        elif path == "/missing":
            self._send(b"not found", "text/plain", 404)
        elif path.startswith("/redirect/"):
            n = int(path.rsplit("/", 1)[1])
            self.send_response(302)
            self.send_header("Location", "/img.png" if n <= 1 else f"/redirect/{n - 1}")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path.startswith("/to-localhost"):
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.server.server_port}/img.png")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/to-file":
            self.send_response(301)
            self.send_header("Location", "file:///etc/passwd")
            self.end_headers()
        elif path == "/endless":          # no Content-Length, never ends
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            chunk = b"\0" * 65536
            try:
                while not self.server.stopping.is_set():
                    self.wfile.write(chunk)
            except OSError:
                pass
        elif path == "/huge-length":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(10**9))
            self.end_headers()
            self.wfile.write(PNG_BYTES)
        elif path == "/slow":             # answers after 2 s (the test gives up at 0.3 s)
            time.sleep(2.0)
            try:
                self._send(PNG_BYTES)
            except OSError:
                pass
        elif path == "/drip":               # headers at once, then a byte every 0.1 s
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            try:
                for b in PNG_BYTES[:20]:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass
        else:
            self._send(b"?", "text/plain", 404)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


@pytest.fixture(scope="module")
def server():
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.hits = []
    srv.stopping = threading.Event()
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.stopping.set()
    srv.shutdown()
    srv.server_close()


def base(server) -> str:
    return f"http://127.0.0.1:{server.server_port}"


LOCAL = MediaConfig(allow_private=True, fetch_timeout=5.0)


async def test_fetch_png(server):
    out = await load_image(base(server) + "/img.png", LOCAL)
    assert out.mime == "image/png" and out.data == PNG_BYTES
    np.testing.assert_array_equal(pixels(out.image), RGB)


async def test_fetch_with_given_client(server):
    async with httpx.AsyncClient() as client:
        out = await load_image(base(server) + "/img.png", LOCAL, client=client)
    assert out.sha256 == hashlib.sha256(PNG_BYTES).hexdigest()


async def test_fetch_content_type_octet_stream_is_sniffed(server):
    assert (await load_image(base(server) + "/octet", LOCAL)).mime == "image/png"


async def test_fetch_content_type_checked_when_image(server):
    e = await media_error(base(server) + "/mislabelled", LOCAL)
    assert e.code == "invalid_image"
    e = await media_error(base(server) + "/svg", LOCAL)
    assert e.code == "unsupported_image_type"


async def test_fetch_http_error_status(server):
    e = await media_error(base(server) + "/missing", LOCAL)
    assert e.code == "invalid_image_url" and "404" in str(e)


async def test_loopback_refused_by_default(server):
    n = len(server.hits)
    for url in (base(server) + "/img.png", f"http://localhost:{server.server_port}/img.png",
                f"http://[::1]:{server.server_port}/img.png"):
        e = await media_error(url, MediaConfig())
        assert e.code == "invalid_image_url" and "refused" in str(e)
    assert len(server.hits) == n          # nothing was requested


async def test_guarded_connect_refuses_private_addresses(server):
    # the connect-time check (closes the DNS-rebinding gap between check and connect)
    with pytest.raises(MediaError):
        await _GuardedBackend().connect_tcp("127.0.0.1", server.server_port)


async def test_dns_answer_changing_after_the_check_is_caught(server, monkeypatch):
    # DNS rebinding: the per-hop check sees a public address, the connect sees loopback
    from ggserve.server.api import media_fetch
    real, calls = media_fetch._resolve_checked, []

    async def rebinding(host, port, url):
        calls.append(host)
        if len(calls) == 1:
            return ["93.184.216.34"]
        return await real(host, port, url)

    monkeypatch.setattr(media_fetch, "_resolve_checked", rebinding)
    n = len(server.hits)
    e = await media_error(base(server) + "/img.png", MediaConfig())
    assert e.code == "invalid_image_url" and "loopback" in str(e)
    assert len(calls) == 2 and len(server.hits) == n


async def test_redirects_followed_up_to_the_limit(server):
    out = await load_image(base(server) + "/redirect/3", LOCAL)    # 3 redirects
    assert out.data == PNG_BYTES
    e = await media_error(base(server) + "/redirect/4", LOCAL)
    assert e.code == "invalid_image_url" and "redirect" in str(e)
    e = await media_error(base(server) + "/redirect/1", MediaConfig(allow_private=True, max_redirects=0))
    assert e.code == "invalid_image_url"


async def test_redirect_hops_are_checked(server):
    # allowed host redirects to a host not on the list: refused at the second hop
    cfg = MediaConfig(allow_private=True, allowed_domains=["127.0.0.1"])
    assert (await load_image(base(server) + "/img.png", cfg)).data == PNG_BYTES
    e = await media_error(base(server) + "/to-localhost", cfg)
    assert e.code == "invalid_image_url" and "localhost" in str(e)
    e = await media_error(base(server) + "/to-file", LOCAL)
    assert e.code == "invalid_image_url"


async def test_domain_allow_list(server):
    n = len(server.hits)
    e = await media_error(base(server) + "/img.png",
                          MediaConfig(allow_private=True, allowed_domains=["example.com"]))
    assert e.code == "invalid_image_url" and "allowed" in str(e)
    assert len(server.hits) == n


async def test_fetch_disabled(server):
    cfg = MediaConfig(fetch_enabled=False, allow_private=True)
    n = len(server.hits)
    e = await media_error(base(server) + "/img.png", cfg)
    assert e.code == "invalid_image_url" and "disabled" in str(e)
    assert len(server.hits) == n
    assert (await load(PNG_BYTES, "image/png", cfg)).data == PNG_BYTES    # data: still works


async def test_http_byte_limit_stops_reading(server):
    # the body never ends: finishing at all (with image_too_large) means reading stopped
    t0 = time.monotonic()
    e = await media_error(base(server) + "/endless", MediaConfig(allow_private=True, max_bytes=100_000))
    assert e.code == "image_too_large"
    assert time.monotonic() - t0 < 3


async def test_http_byte_limit_from_content_length(server):
    e = await media_error(base(server) + "/huge-length", LOCAL)
    assert e.code == "image_too_large"


async def test_http_byte_limit_exact(server):
    assert (await load_image(base(server) + "/img.png",
                             MediaConfig(allow_private=True, max_bytes=len(PNG_BYTES)))).data == PNG_BYTES
    e = await media_error(base(server) + "/img.png",
                          MediaConfig(allow_private=True, max_bytes=len(PNG_BYTES) - 1))
    assert e.code == "image_too_large"


async def test_fetch_timeout(server):
    t0 = time.monotonic()
    e = await media_error(base(server) + "/slow", MediaConfig(allow_private=True, fetch_timeout=0.3))
    assert e.code == "invalid_image_url" and "timed out" in str(e)
    assert time.monotonic() - t0 < 1.5


async def test_fetch_timeout_is_a_total_deadline(server):
    # each byte arrives well within the timeout, but the whole body takes 2 s
    t0 = time.monotonic()
    e = await media_error(base(server) + "/drip", MediaConfig(allow_private=True, fetch_timeout=0.5))
    assert e.code == "invalid_image_url" and "timed out" in str(e)
    assert time.monotonic() - t0 < 1.5


async def test_unresolvable_host():
    e = await media_error("http://does-not-exist.invalid/a.png", MediaConfig(fetch_timeout=3))
    assert e.code == "invalid_image_url"


def test_free_port_is_closed_error():
    # connection refused -> invalid_image_url
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    import asyncio
    with pytest.raises(MediaError) as ei:
        asyncio.run(load_image(f"http://127.0.0.1:{port}/x.png", LOCAL))
    assert ei.value.code == "invalid_image_url"
