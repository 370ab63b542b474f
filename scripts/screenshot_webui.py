"""Screenshot of the chat page with a conversation, for README.md.

Starts `ggserve serve` (default model, greedy sampling chosen in the page) on a
free loopback port, chats through headless Chromium and saves the PNG:

    .venv/bin/python scripts/screenshot_webui.py [--out docs/webui.png]
"""
from __future__ import annotations

import argparse
import io
import shutil
import socket
import subprocess
import sys
import time

import httpx
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

CHATS = [  # conversations: (messages, max_tokens)
    (["Name three colours."], 24),
    (["Write a Python function that reverses a string.",
      "List three tips for learning to code, as a numbered list with **bold** titles."], 110),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if fn():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def chat(driver, messages: list[str], max_tokens: int) -> None:
    driver.execute_script("document.querySelector('#new-chat').click()")  # in the drawer on phones
    driver.find_element(By.ID, "toggle-settings").click()
    for field, value in (("temperature", 0), ("max_tokens", max_tokens)):
        box = driver.find_element(By.ID, field)
        box.clear()
        box.send_keys(str(value), Keys.TAB)
    driver.find_element(By.ID, "toggle-settings").click()
    for text in messages:
        driver.find_element(By.ID, "input").send_keys(text, Keys.ENTER)
        time.sleep(0.5)
        wait(lambda: driver.execute_script("return document.querySelector('#stop').hidden"), 120, "the answer")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="docs/webui.png")
    p.add_argument("--size", default="1100x760", help="page size, WxH")
    args = p.parse_args()
    width, height = (int(x) for x in args.size.split("x"))

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "ggserve.server.cli.main", "serve", "--port", str(port),
                               "-t", "1", "-np", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    driver = None
    try:
        wait(lambda: httpx.get(url + "/health").status_code == 200, 300, "the server")
        opts = webdriver.ChromeOptions()
        opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                  "--hide-scrollbars", f"--window-size={width},{height}"):
            opts.add_argument(a)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                                  options=opts)
        inner = driver.execute_script("return window.innerHeight")
        driver.set_window_size(width, 2 * height - inner)    # the page gets WxH
        driver.get(url + "/")
        driver.execute_script("localStorage.clear()")
        driver.refresh()
        for messages, max_tokens in CHATS:
            chat(driver, messages, max_tokens)
        png = driver.get_screenshot_as_png()
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        server.wait(timeout=30)
    # a palette of 96 colours keeps text crisp and the file small
    img = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=96, dither=Image.Dither.NONE)
    img.save(args.out, optimize=True)
    print(f"{args.out}: {img.width}x{img.height}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
