"""The chat page with audio, in a real headless Chromium against a server on the synthetic
Ultravox mmproj: a clip attached from the file picker and one recorded from Chromium's fake
microphone reach the model as input_audio parts (their 375 audio rows counted in the
prompt); a text-only server's page refuses audio."""
import os

import httpx
import pytest
import synth_audio as SA
from server_harness import RunningServer
from test_webui import CHROMEDRIVER, CHROMIUM, last_error, last_stats, open_page, set_field, type_message, wait_for

from ggserve.server.app import ServerConfig, create_app

CLIP = SA.SYNTH / "audio" / "tone_16k_mono_1s.wav"
ULTRAVOX_ROWS = 375


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("chromium and chromium-driver are not installed (scripts/install.sh installs them)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1200,900",
                "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def server():
    cfg = ServerConfig(model=str(SA.TEXT_MODEL), mmproj=SA.mmproj("ultravox"), n_ctx=4096, n_parallel=1,
                       n_batch=2048, n_threads=2, metrics=True)
    with RunningServer(create_app(cfg)) as srv:
        yield srv


def _ask(browser, srv, text):
    set_field(browser, "max_tokens", 2)
    type_message(browser, text)
    wait_for(lambda: last_stats(browser).get("completion"), timeout=120, what="the answer")
    assert last_error(browser) == ""
    return int(last_stats(browser)["prompt"])


def test_attached_clip_reaches_the_model(browser, server):
    from selenium.webdriver.common.by import By

    text = "What do you hear?"
    plain = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": text}], "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    open_page(browser, server.url)
    browser.find_element(By.ID, "file").send_keys(str(CLIP))
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#attachments audio"), what="the clip's player")
    assert _ask(browser, server, text) == plain + ULTRAVOX_ROWS
    assert browser.find_elements(By.CSS_SELECTOR, ".msg.user .thumbs audio")
    browser.get("about:blank")


def test_recorded_clip_reaches_the_model(browser, server):
    from selenium.webdriver.common.by import By

    open_page(browser, server.url)
    record = wait_for(lambda: [b for b in browser.find_elements(By.ID, "record") if b.is_displayed()],
                      what="the Record button")[0]
    record.click()
    wait_for(lambda: record.text == "Stop recording", what="recording")
    import time
    time.sleep(1.0)
    record.click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#attachments audio"), what="the recorded clip")
    src = browser.find_element(By.CSS_SELECTOR, "#attachments audio").get_attribute("src")
    assert src.startswith("data:audio/wav;base64,")
    text = "Transcribe this."
    plain = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": text}], "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    assert _ask(browser, server, text) == plain + ULTRAVOX_ROWS
    browser.get("about:blank")


def test_audio_on_a_text_only_server_is_refused_in_the_page(browser, smollm2_path):
    from selenium.webdriver.common.by import By

    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=1024, n_parallel=1, n_threads=1))) as srv:
        open_page(browser, srv.url)
        wait_for(lambda: "take images or audio" in browser.find_element(By.ID, "attach").get_attribute("title"),
                 what="the attach button's title")
        assert not browser.find_element(By.ID, "record").is_displayed()
        browser.find_element(By.ID, "file").send_keys(str(CLIP))
        wait_for(lambda: "does not take audio" in browser.find_element(By.ID, "notice").text, what="the notice")
        assert browser.find_elements(By.CSS_SELECTOR, "#attachments audio") == []
    browser.get("about:blank")
