"""Images through the Responses API (`input_image`) and the Anthropic Messages API
(`image` blocks, base64 and url sources), with the official SDKs, on Gemma 3 with
the golden's synthetic projector: the answer and the prompt's token count equal
/v1/chat/completions with the same image as an `image_url` part. One server, so
the image is encoded once (later requests hit the embedding cache)."""
from __future__ import annotations

import base64
import functools
import http.server
import pathlib
import threading

import anthropic
import openai
import pytest

from ggserve.server.app import ServerConfig, create_app
from ggserve.server.api.media import MediaConfig
from server_harness import RunningServer

IMAGES = pathlib.Path(__file__).parent / "data" / "vision"
PNG = base64.b64encode((IMAGES / "grad_64x64.png").read_bytes()).decode()
DATA_URL = "data:image/png;base64," + PNG
ASK = "Describe this image."


@pytest.fixture(scope="module")
def server(gemma3_path, mmproj_dir):
    # http(s) images come from a loopback server here, so private addresses are allowed
    cfg = ServerConfig(model=gemma3_path, mmproj=str(mmproj_dir / "mmproj-synth-gemma3-f16.gguf"),
                       n_ctx=1024, n_parallel=1, n_batch=512, n_threads=2, media=MediaConfig(allow_private=True))
    with RunningServer(create_app(cfg)) as srv:
        yield srv


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def chat_answer(oai):
    """The image as an image_url part of /v1/chat/completions, greedy: (text, prompt tokens)."""
    c = oai.chat.completions.create(model="x", max_tokens=8, temperature=0, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": DATA_URL}}, {"type": "text", "text": ASK}]}])
    assert c.usage.prompt_tokens > 256                 # the image's 256 tokens are in it
    return c.choices[0].message.content, c.usage.prompt_tokens


@pytest.fixture(scope="module")
def image_host():
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(IMAGES))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.parametrize("kind", ["data", "http"])
def test_responses_input_image(oai, chat_answer, image_host, kind):
    url = DATA_URL if kind == "data" else image_host + "/grad_64x64.png"
    r = oai.responses.create(model="x", max_output_tokens=8, temperature=0, input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": url}, {"type": "input_text", "text": ASK}]}])
    assert (r.output_text, r.usage.input_tokens) == chat_answer


@pytest.mark.parametrize("source", ["base64", "url"])
def test_anthropic_image_block(server, chat_answer, image_host, source):
    src = {"type": "base64", "media_type": "image/png", "data": PNG} if source == "base64" else \
        {"type": "url", "url": image_host + "/grad_64x64.png"}
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=300)
    m = client.messages.create(model="x", max_tokens=8, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [{"type": "image", "source": src}, {"type": "text", "text": ASK}]}])
    assert (m.content[0].text, m.usage.input_tokens + m.usage.cache_read_input_tokens) == chat_answer
