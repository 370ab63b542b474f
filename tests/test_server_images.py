"""Images through the real HTTP server: image_url parts with the openai SDK, several
images, the embedding cache across requests, and every bad input as a 400."""
import base64
import pathlib

import httpx
import openai
import pytest

from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer

IMAGES = pathlib.Path(__file__).parent / "data" / "vision"


def data_url(name: str, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode((IMAGES / name).read_bytes()).decode()


def image_message(*urls, text="Describe this image."):
    return [{"role": "user", "content": [*({"type": "image_url", "image_url": {"url": u}} for u in urls),
                                          {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def server(smollm2_path, mmproj_dir):
    cfg = ServerConfig(model=smollm2_path, mmproj=str(mmproj_dir / "mmproj-synth-mlp-f16.gguf"),
                       n_ctx=4096, n_parallel=2, n_batch=512, n_threads=2, metrics=True)
    with RunningServer(create_app(cfg)) as srv:
        srv.model = httpx.get(srv.url + "/v1/models").json()["data"][0]["id"]
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def test_streaming_chat_with_an_image(client, server):
    stream = client.chat.completions.create(
        model=server.model, messages=image_message(data_url("grad_64x64.png")), max_tokens=6, temperature=0,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text
    assert usage.prompt_tokens == 610          # llama.cpp's count for this image and prompt
    assert usage.completion_tokens == 6


def test_two_images_in_one_message(client, server):
    r = client.chat.completions.create(
        model=server.model, messages=image_message(data_url("grad_64x64.png"), data_url("checker_300x200.png")),
        max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens == 610 + 576
    assert r.choices[0].finish_reason in ("stop", "length")


def test_same_image_again_skips_the_encoder(client, server):
    msg = image_message(data_url("tall_200x600.png"), text="What is this?")
    first = client.chat.completions.create(model=server.model, messages=msg, max_tokens=6, temperature=0)
    misses = server.metric("ggserve_image_cache_misses_total")
    hits = server.metric("ggserve_image_cache_hits_total")
    # text before the image: no cached prefix covers it, only the embedding cache can
    msg2 = [{"role": "user", "content": [{"type": "text", "text": "Look at this picture."},
                                         {"type": "image_url", "image_url": {"url": data_url("tall_200x600.png")}},
                                         {"type": "text", "text": "What is this?"}]}]
    second = client.chat.completions.create(model=server.model, messages=msg2, max_tokens=6, temperature=0)
    assert server.metric("ggserve_image_cache_misses_total") == misses
    assert server.metric("ggserve_image_cache_hits_total") == hits + 1
    again = client.chat.completions.create(model=server.model, messages=msg, max_tokens=6, temperature=0)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert second.choices[0].message.content


BAD = {
    "bad_base64": "data:image/png;base64,@@@not-base64@@@",
    "unsupported_mime": "data:text/plain;base64," + base64.b64encode(b"hello").decode(),
    "undecodable": "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n garbage").decode(),
    "truncated": "data:image/png;base64," + base64.b64encode((IMAGES / "shapes_896x896.png").read_bytes()[:5000]).decode(),
    "loopback_url": "http://127.0.0.1:9/x.png",
    "file_url": "file:///etc/passwd",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_image_is_a_400_and_the_server_keeps_serving(server, client, case):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"messages": image_message(BAD[case]), "max_tokens": 2})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    ok = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert ok.choices[0].message.content is not None
    assert server.metric("ggserve_kv_cells_used") >= 0


def test_image_to_a_text_only_server_is_a_400(smollm2_path):
    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=1024, n_parallel=1, n_threads=2))) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60,
                       json={"messages": image_message(data_url("grad_64x64.png")), "max_tokens": 2})
        assert r.status_code == 400
        assert "does not support images" in r.json()["error"]["message"]
