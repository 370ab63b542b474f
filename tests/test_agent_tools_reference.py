"""ggserve's /tools answers equal llama-server 11434's, call for call (tests/data/agent_tools/:
reference.json, made by record.py there): the listing of the built-in tools, and each call's
status, body and, for write_file and edit_file, what the file holds afterwards; the listing and
the answers of an MCP server's tools.

Listings (file_glob_search, grep over a folder) are compared as sets of lines: both servers
walk in the order the file system gives, which another file system may give differently."""
from __future__ import annotations

import json
import os
import sys

import httpx
import pytest
from server_harness import RunningServer

from ggserve.server.agent_tools import mcp_config
from ggserve.server.agent_tools.config import AgentToolsConfig
from ggserve.server.app import ServerConfig, create_app

REF = json.load(open(os.path.join(os.path.dirname(__file__), "data", "agent_tools", "reference.json"),
                     encoding="utf-8"))
CASES = list(zip(REF["calls"], REF["answers"]))


@pytest.fixture(scope="module")
def server(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=512, n_parallel=1, n_threads=1,
                       agent=AgentToolsConfig(tools=("all",)))
    with RunningServer(create_app(cfg)) as s:
        yield s


def lay_out(root) -> None:
    for rel, text in REF["tree"].items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def unordered(body: dict) -> dict:
    """A listing's lines and entries as sets: the order is the file system's."""
    out = dict(body)
    if "plain_text_response" in out:
        out["plain_text_response"] = sorted(out["plain_text_response"].split("\n"))
    if "entries" in out:
        out["entries"] = sorted(json.dumps(e, sort_keys=True) for e in out["entries"])
    return out


def test_the_listing_is_llama_servers(server):
    assert httpx.get(server.url + "/tools").json() == REF["listing"]


@pytest.mark.parametrize("call, want", CASES, ids=[f"{i}-{c['tool']}" for i, (c, _) in enumerate(CASES)])
def test_each_call_answers_as_llama_server(server, tmp_path, call, want):
    lay_out(tmp_path)
    r = httpx.post(server.url + "/tools", json={"tool": call["tool"], "params": call["params"]},
                   headers={"x-tool-cwd": os.path.join(tmp_path, call["cwd"])}, timeout=60)
    assert r.status_code == want["status"]
    if r.status_code != 200:           # a request error: the status (ggserve's message names the tool)
        return
    body = json.loads(r.text.replace(str(tmp_path), "<ROOT>"))
    if want["body"].get("error", "").startswith("invalid regex: "):   # the rest is the regex library's own words
        assert body["error"].startswith("invalid regex: ")
        return
    if call["tool"] in ("file_glob_search", "grep_search"):
        assert unordered(body) == unordered(want["body"])
    else:
        assert body == want["body"]
    if "after" in want:
        path = tmp_path / call["cwd"] / call["params"]["path"]
        assert (path.read_text(encoding="utf-8") if path.exists() else None) == want["after"]


# --- MCP servers: tests/data/mcp/notes_server.py as "notes", and a command that does not exist ----

NOTES = os.path.join(os.path.dirname(__file__), "data", "mcp", "notes_server.py")


@pytest.fixture(scope="module")
def mcp_server(smollm2_path):
    text = json.dumps(REF["mcp"]["config"]).replace("<PYTHON>", sys.executable).replace("<NOTES>", NOTES)
    cfg = ServerConfig(model=smollm2_path, n_ctx=512, n_parallel=1, n_threads=1,
                       agent=AgentToolsConfig(mcp_servers=tuple(mcp_config.parse(text))))
    with RunningServer(create_app(cfg)) as s:
        yield s


def test_mcp_tools_are_listed_as_llama_server_lists_them(mcp_server):
    assert httpx.get(mcp_server.url + "/tools").json() == REF["mcp"]["listing"]


def test_mcp_calls_answer_as_llama_server(mcp_server):
    """In the recorded order: a result, a tool error, a timeout, a crash, the server spawned again."""
    got = []
    for call in REF["mcp"]["calls"]:
        r = httpx.post(mcp_server.url + "/tools", json={"tool": call["tool"], "params": call["params"]}, timeout=60)
        got.append({"status": r.status_code, "body": r.json() if r.status_code == 200 else None})
    want = [{"status": a["status"], "body": a["body"] if a["status"] == 200 else None} for a in REF["mcp"]["answers"]]
    assert got == want
