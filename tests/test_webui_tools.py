"""The chat page with the server's tools (--tools), in a real headless Chromium: a tool call the
model made waits for the user, runs on /tools in the working directory set on the page, its result
is shown and fed back, and the model answers again; a denied call runs nothing."""
from __future__ import annotations

import json

import pytest
from server_harness import RunningServer
from test_webui import browser, js, severe_logs, streaming, wait_for  # noqa: F401 (browser: a fixture)

from ggserve.server.agent_tools.config import AgentToolsConfig
from ggserve.server.app import ServerConfig, create_app


@pytest.fixture(scope="module")
def server(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=2048, n_parallel=1, n_threads=1,
                       agent=AgentToolsConfig(tools=("read_file", "write_file")))
    with RunningServer(create_app(cfg)) as srv:
        yield srv


def open_with_call(driver, url, cwd, name, arguments):
    """The page with one conversation whose last answer is the model's call of `name`."""
    conv = {"id": "c38", "title": "tools", "updated": 1, "system": "", "temperature": "0", "top_p": "",
            "max_tokens": "8", "messages": [
                {"role": "user", "content": "Use the tool."},
                {"role": "assistant", "content": "", "reasoning": "", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": name, "arguments": json.dumps(arguments)}}]}]}
    driver.get(url + "/")
    js(driver, "localStorage.clear(); localStorage.setItem('ggserve.conversations', arguments[0]);"
               "localStorage.setItem('ggserve.current', 'c38'); localStorage.setItem('ggserve.toolCwd', arguments[1]);",
       json.dumps([conv]), str(cwd))
    driver.refresh()
    wait_for(lambda: js(driver, "return serverTools.length > 0"), what="GET /tools")
    wait_for(lambda: js(driver, "return document.querySelector('.run-tool') !== null"), what="the Run button")


def stored_messages(driver) -> list:
    return js(driver, "return JSON.parse(localStorage.getItem('ggserve.conversations'))[0].messages")


def test_the_page_offers_the_servers_tools(browser, server, tmp_path):  # noqa: F811
    open_with_call(browser, server.url, tmp_path, "read_file", {"path": "x"})
    assert js(browser, "return toolDefinitions().map((d) => d.function.name)") == ["read_file", "write_file"]
    assert js(browser, "return document.querySelector('#tools-settings').hidden") is False


def test_an_allowed_call_runs_and_the_model_answers_its_result(browser, server, tmp_path):  # noqa: F811
    (tmp_path / "marker.txt").write_text("the marker is 42")
    browser.get_log("browser")
    open_with_call(browser, server.url, tmp_path, "read_file", {"path": "marker.txt"})
    js(browser, "document.querySelector('.run-tool').click()")
    wait_for(lambda: js(browser, "return document.querySelector('.msg.tool pre')?.textContent"), what="the result")
    wait_for(lambda: len(stored_messages(browser)) == 4 and not streaming(browser), what="the next answer")
    messages = stored_messages(browser)
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "name": "read_file",
                           "content": "the marker is 42\n"}
    assert messages[3]["role"] == "assistant" and not messages[3].get("error")
    assert messages[3]["stats"]["prompt_tokens"] > 0
    assert js(browser, "return document.querySelector('.msg.tool pre').textContent") == "the marker is 42\n"
    assert severe_logs(browser) == []


def test_a_denied_call_runs_nothing(browser, server, tmp_path):  # noqa: F811
    open_with_call(browser, server.url, tmp_path, "write_file", {"path": "made.txt", "content": "x"})
    js(browser, "document.querySelector('.deny-tool').click()")
    wait_for(lambda: len(stored_messages(browser)) == 4 and not streaming(browser), what="the next answer")
    assert stored_messages(browser)[2]["content"] == "The user denied this tool call."
    assert not (tmp_path / "made.txt").exists()
