"""Browser-test fixtures: one real server (``tests.ui.serve``, small storage limits) on
127.0.0.1 with a temporary data directory, Debian's Chromium driven by Playwright, and
the screenshot directory ``test-output/screenshots/``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from tests.app.conftest import free_port

ADMIN_PASSWORD = "admin-ui-password"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-output" / "screenshots"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
VIEWPORT = {"width": 1440, "height": 900}


class UiServer:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.log_path = data_dir.parent / "ui-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> UiServer:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUORRA_")}
        env["QUORRA_ADMIN_PASSWORD"] = ADMIN_PASSWORD
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.ui.serve", str(self.data_dir), str(self.port)],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited:\n{self.output()}"
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"server not ready in {START_TIMEOUT_S}s:\n{self.output()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def api(self, user: str = "admin", password: str = ADMIN_PASSWORD) -> httpx.Client:
        response = httpx.post(f"{self.url}/api/v1/tokens", auth=(user, password), timeout=10.0)
        assert response.status_code == 201, response.text
        token = response.json()["token"]
        return httpx.Client(
            base_url=f"{self.url}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30.0,
        )


@pytest.fixture(scope="session")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    server = UiServer(tmp_path_factory.mktemp("quorra-ui") / "data").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Per module: Playwright's sync API runs an event loop in this thread while it is
    open, and tests after the browser tests need the thread free for their own."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium package")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    ctx.set_default_timeout(10_000)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())  # hx-confirm
    return page


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def log_in(page: Page, server: UiServer, user: str, password: str, shot: str = "") -> None:
    page.goto(f"{server.url}/login")
    page.fill('input[name="username"]', user)
    page.fill('input[name="password"]', password)
    if shot:
        screenshot(page, shot)
    page.click('button[type="submit"]')
    page.wait_for_url(f"{server.url}/")
