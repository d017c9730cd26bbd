"""Browser-test fixtures: one real server (``tests.app.ui.serve``, small storage limits) on
127.0.0.1 with a temporary data directory, Debian's Chromium driven by Playwright, and
the screenshot directory ``test-output/screenshots/``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from tests.app.conftest import ROOT, Server, make_token

ADMIN_PASSWORD = "admin-ui-password"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
SCREENSHOTS = ROOT / "test-output" / "screenshots"
VIEWPORT = {"width": 1440, "height": 900}


class UiServer(Server):
    """The app with small storage limits (``tests.app.ui.serve``), so that a few hundred KiB
    of messages make several segments."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, admin_password=ADMIN_PASSWORD)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tests.app.ui.serve", str(self.data_dir), str(self.port)]

    def api(self, user: str = "admin", password: str = ADMIN_PASSWORD) -> httpx.Client:
        token = make_token(self, user, password)
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
