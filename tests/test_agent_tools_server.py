"""/tools and /cors-proxy through the real server (create_app on uvicorn), and the flags that turn
them on: off by default (403 as llama-server answers), behind the API key, CORS limited to
localhost pages once tools are on, headers (not the model) saying where a call runs."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from server_harness import RunningServer, sse_events

from ggserve.server.agent_tools.config import AgentToolsConfig
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.cli.main import config_from_args, serve_parser

KEY = {"Authorization": "Bearer k38"}


@pytest.fixture(scope="module")
def srv(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=512, n_parallel=1, n_threads=1, api_keys=["k38"],
                       cors_origins=["localhost"], agent=AgentToolsConfig(tools=("all",), cors_proxy=True))
    with RunningServer(create_app(cfg)) as s:
        yield s


@pytest.fixture(scope="module")
def plain(smollm2_path):
    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=512, n_parallel=1, n_threads=1))) as s:
        yield s


def cors_of(*argv):
    return config_from_args(serve_parser().parse_args(list(argv))).cors_origins


def test_cors_defaults_to_localhost_once_tools_or_mcp_servers_are_on():
    mcp = json.dumps({"mcpServers": {"x": {"command": "true"}}})
    assert cors_of() == ["*"]
    assert cors_of("--tools", "read_file") == ["localhost"]
    assert cors_of("--mcp-servers-json", mcp) == ["localhost"]
    assert cors_of("--agent") == ["localhost"]
    assert cors_of("--tools", "all", "--cors-origins", "*") == ["*"]      # said explicitly: kept


def test_a_page_from_another_origin_gets_no_cors_grant(srv):
    evil = httpx.get(srv.url + "/tools", headers={**KEY, "Origin": "http://evil.example"})
    local = httpx.get(srv.url + "/tools", headers={**KEY, "Origin": "http://localhost:5173"})
    assert "access-control-allow-origin" not in evil.headers
    assert local.headers["access-control-allow-origin"] == "http://localhost:5173"


def test_tools_need_the_api_key(srv):
    assert httpx.get(srv.url + "/tools").status_code == 401
    denied = httpx.post(srv.url + "/tools", json={"tool": "exec_shell_command", "params": {"command": "true"}})
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    listed = httpx.get(srv.url + "/tools", headers=KEY).json()
    assert [t["tool"] for t in listed] == ["read_file", "file_glob_search", "grep_search", "exec_shell_command",
                                           "write_file", "edit_file", "get_info"]


def test_tools_and_the_proxy_are_off_by_default(plain):
    for method, path in (("GET", "/tools"), ("POST", "/tools"), ("GET", "/cors-proxy?url=http://127.0.0.1/")):
        r = httpx.request(method, plain.url + path, json={"tool": "get_info"} if method == "POST" else None)
        assert r.status_code == 403
        assert r.json()["error"]["type"] == "feature_disabled"


def test_cwd_header_overrides_the_models_cwd(srv, tmp_path):
    (tmp_path / "marker.txt").write_text("marker")
    r = httpx.post(srv.url + "/tools", headers={**KEY, "x-tool-cwd": str(tmp_path)},
                   json={"tool": "read_file", "params": {"path": "marker.txt", "cwd": "/nonexistent"}})
    assert r.json() == {"plain_text_response": "marker\n"}


def test_streamed_shell_command(srv, tmp_path):
    r = httpx.post(srv.url + "/tools", headers={**KEY, "x-tool-cwd": str(tmp_path)},
                   json={"tool": "exec_shell_command", "params": {"command": "echo hello"}, "stream": True})
    events = sse_events(r)
    assert events[-1] == {"done": True}
    assert "".join(e["chunk"] for e in events[:-1]) == "hello\n\n[exit code: 0]"


def test_request_errors_in_the_api_shape(srv):
    unknown = httpx.post(srv.url + "/tools", headers=KEY, json={"tool": "nope", "params": {}})
    assert (unknown.status_code, unknown.json()["error"]["message"]) == (404, 'unknown tool "nope"')
    no_stream = httpx.post(srv.url + "/tools", headers=KEY, json={"tool": "read_file", "params": {}, "stream": True})
    assert no_stream.status_code == 404
    injected = httpx.post(srv.url + "/tools", headers={**KEY, "x-tool-runtime": "docker-container:--privileged"},
                          json={"tool": "exec_shell_command", "params": {"command": "echo hi"}})
    assert (injected.status_code, injected.json()["error"]["message"]) == (500, "invalid container id: --privileged")
    bad = httpx.post(srv.url + "/tools", headers=KEY, json={"tool": 3})
    assert bad.status_code == 400


def test_props_say_whether_the_proxy_is_on(srv, plain):
    assert httpx.get(srv.url + "/props", headers=KEY).json()["cors_proxy_enabled"] is True
    assert httpx.get(plain.url + "/props").json()["cors_proxy_enabled"] is False


def test_cors_proxy_forwards_prefixed_headers_and_keeps_the_status(srv):
    class NoContent(BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a):
            pass

    target = ThreadingHTTPServer(("127.0.0.1", 0), NoContent)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    try:
        own = httpx.get(srv.url + "/cors-proxy", params={"url": srv.url + "/tools"},
                        headers={**KEY, "x-llama-server-proxy-header-Authorization": "Bearer k38"})
        assert own.status_code == 200 and own.json()[0]["tool"] == "read_file"
        empty = httpx.post(srv.url + "/cors-proxy", params={"url": f"http://127.0.0.1:{target.server_port}/"},
                           headers=KEY, json={})
        assert (empty.status_code, empty.content) == (204, b"")
        for url, message in (("ftp://example.com/", "unsupported URL scheme in target URL: ftp"),
                             ("http://u:p@127.0.0.1/", "authentication in target URL is not supported")):
            r = httpx.get(srv.url + "/cors-proxy", params={"url": url}, headers=KEY)
            assert (r.status_code, r.json()["error"]["message"]) == (500, message)
    finally:
        target.shutdown()
        target.server_close()
