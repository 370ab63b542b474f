"""--api-prefix as llama-server: every endpoint and the chat page answer under the prefix
(for a reverse proxy that forwards /PREFIX/... unchanged), and nothing outside it."""
from __future__ import annotations

import httpx
import pytest

from ggserve.server.api.prefix import normalized
from ggserve.server.app import create_app
from ggserve.server.cli.main import config_from_args, serve_parser
from server_harness import RunningServer


@pytest.fixture(scope="module")
def server(smollm2_path):
    args = serve_parser().parse_args(["-m", smollm2_path, "--api-prefix", "/llama", "-c", "512", "-np", "1",
                                      "-t", "1"])
    with RunningServer(create_app(config_from_args(args)), health_path="/llama/health") as s:
        yield s


def test_the_api_answers_under_the_prefix(server):
    r = httpx.post(server.url + "/llama/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert httpx.get(server.url + "/llama/v1/models").json()["data"][0]["id"]


def test_paths_outside_the_prefix_are_a_404_in_the_api_shape(server):
    r = httpx.get(server.url + "/v1/models")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_the_chat_page_is_served_under_the_prefix_with_its_slash(server):
    r = httpx.get(server.url + "/llama")
    assert r.status_code == 308 and r.headers["location"] == "/llama/"
    page = httpx.get(server.url + "/llama/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]


@pytest.mark.parametrize("given,prefix", [("/llama", "/llama"), ("llama/", "/llama"), ("", ""), ("/", "")])
def test_prefix_spellings(given, prefix):
    assert normalized(given) == prefix
