"""The dashboard in Debian's Chromium against a real server: every page and action an
operator uses, live figures changing without a page load, and a user without
``configure`` who neither sees the admin buttons nor gets past the server."""

from __future__ import annotations

import json

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.app.ui.conftest import ADMIN_PASSWORD, UiServer, log_in, screenshot

pytestmark = pytest.mark.browser

BODY = "x" * 1000
BATCHES = 120
PER_BATCH = 4
ACKED = 200


def no_reload_marker(page: Page) -> None:
    page.evaluate("window.__quorraNoReload = 1")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__quorraNoReload") == 1, "the page was loaded again"


def fill_and_drain(server: UiServer, queue: str) -> None:
    """Enough entries to roll the small WAL into several segments, then ack most of
    them: the first segments hold only dead entries."""
    with server.api() as api:
        for _ in range(BATCHES):
            batch = {"messages": [{"body": BODY} for _ in range(PER_BATCH)]}
            assert api.post(f"/queues/{queue}/messages", json=batch).status_code == 201
        acked = 0
        while acked < ACKED:
            got = api.post(
                f"/queues/{queue}/messages/receive",
                json={"max_messages": min(100, ACKED - acked)},
            ).json()["messages"]
            assert got
            response = api.post(
                f"/queues/{queue}/messages/ack", json={"receipts": [m["receipt"] for m in got]}
            )
            assert response.status_code == 200
            acked += len(got)


def segment_count(page: Page) -> int:
    return int(page.locator("#segment-map").get_attribute("data-segments") or 0)


def create_queue(page: Page, server: UiServer, name: str, dead_letter: str = "") -> None:
    page.goto(f"{server.url}/queues")
    form = page.locator("#create-queue")
    form.locator('input[name="name"]').fill(name)
    form.locator('input[name="priorities"]').fill("2")
    if dead_letter:
        form.locator('input[name="dead_letter_queue"]').fill(dead_letter)
    form.locator('button[type="submit"]').click()
    page.wait_for_url(f"{server.url}/queues/{name}")
    expect(page.locator("#queue-name")).to_have_text(name)


def test_operator_journey(page: Page, ui_server: UiServer) -> None:
    log_in(page, ui_server, "admin", ADMIN_PASSWORD, shot="01-login")
    expect(page.locator("text=Queue engine")).to_be_visible()
    expect(page.locator(".pill.ok").first).to_have_text("up")

    create_queue(page, ui_server, "orders.dlq")
    create_queue(page, ui_server, "orders", dead_letter="orders.dlq")

    # An error answer is shown where the operator looks, and nothing changes.
    page.goto(f"{ui_server.url}/queues")
    page.fill('#create-queue input[name="name"]', "orders")
    page.fill('#create-queue input[name="priorities"]', "5")
    page.click('#create-queue button[type="submit"]')
    expect(page.locator("#flash .flash.bad")).to_contain_text("Conflicting queue definition")
    assert page.url == f"{ui_server.url}/queues"
    page.goto(f"{ui_server.url}/queues/orders")

    # Publish from the page: the depth changes without a page load.
    no_reload_marker(page)
    expect(page.locator("#depth-ready")).to_have_text("0")
    page.fill('#publish-form textarea[name="body"]', '{"order": 42, "items": ["tea"]}')
    page.fill('#publish-form textarea[name="headers"]', "content-type: application/json")
    page.click("#publish")
    expect(page.locator("#flash")).to_contain_text("Published message")
    expect(page.locator("#depth-ready")).to_have_text("1")
    page.click("#browse-refresh")
    expect(page.locator("#browse pre.body").first).to_contain_text('"order": 42')
    expect(page.locator("#browse .hdr").first).to_contain_text("content-type")
    assert_not_reloaded(page)

    # Enough traffic for segments; the storage panel picks them up by itself.
    fill_and_drain(ui_server, "orders")
    expect(page.locator("#depth-ready")).to_have_text(str(1 + BATCHES * PER_BATCH - ACKED))
    expect(page.locator("#segment-map .seg").first).to_be_visible(timeout=15_000)
    before = segment_count(page)
    assert before >= 2

    page.click("#take-snapshot")
    expect(page.locator("#flash")).to_contain_text("Snapshot of orders taken")
    expect(page.locator("#snapshot-table tbody tr:not(.empty)")).to_have_count(1)

    page.select_option('#compact-form select[name="phase"]', "1")
    page.click("#compact-now")
    expect(page.locator("#flash")).to_contain_text("ran phase 1")
    expect(page.locator("#compaction-table tbody tr:not(.empty)")).to_have_count(1)
    # Segments the compaction found and left ("a → b"): the WAL may have flushed more
    # segments since ``before`` was read (an idle roll), so the map is compared with what
    # the compaction itself saw.
    cell = page.locator("#compaction-table tbody tr td.num").first.inner_text()
    found, left = (int(part) for part in cell.split("→"))
    assert left < found, cell
    page.wait_for_function(
        "n => Number(document.querySelector('#segment-map').dataset.segments) < n", arg=found
    )
    assert_not_reloaded(page)
    screenshot(page, "04-queue-detail")

    # Dead letters go back where they came from.
    page.goto(f"{ui_server.url}/queues/orders.dlq")
    page.fill('#publish-form textarea[name="body"]', "a dead letter")
    page.click("#publish")
    expect(page.locator("#depth-ready")).to_have_text("1")
    expect(page.locator('#redrive-form input[name="target"]')).to_have_value("orders")
    page.click("#redrive")
    expect(page.locator("#flash")).to_contain_text("Moved 1 messages from orders.dlq to orders")
    expect(page.locator("#depth-ready")).to_have_text("0")
    screenshot(page, "05-dead-letter-queue")

    with ui_server.api() as api:  # first by name, last by depth
        assert api.put("/queues/a.empty", json={"max_message_bytes": 1024}).status_code == 201
    page.goto(f"{ui_server.url}/queues")
    page.fill("#queue-filter", "orders")
    expect(page.locator("#queue-table tbody tr[data-queue]")).to_have_count(2)
    page.fill("#queue-filter", "dlq")
    expect(page.locator("#queue-table tbody tr[data-queue]")).to_have_count(1)
    page.fill("#queue-filter", "")
    rows = page.locator("#queue-table tbody tr[data-queue]")
    expect(rows).to_have_count(3)
    expect(rows.first).to_have_attribute("data-queue", "a.empty")
    page.select_option("#queue-sort", "depth")
    expect(rows.first).to_have_attribute("data-queue", "orders")
    page.select_option("#queue-sort", "name")
    expect(rows.first).to_have_attribute("data-queue", "a.empty")
    screenshot(page, "03-queues")

    page.goto(f"{ui_server.url}/")
    page.wait_for_function("document.querySelector('#total-queues').textContent.trim() === '3'")
    expect(page.locator("#wal-sync")).to_contain_text("p99")
    screenshot(page, "02-overview")

    # Delete from the queue page: confirmed, then back to the list without it.
    page.goto(f"{ui_server.url}/queues/orders")
    page.click("#delete")
    page.wait_for_url(f"{ui_server.url}/queues")
    expect(page.locator('#queue-table tr[data-queue="orders"]')).to_have_count(0)
    expect(page.locator('#queue-table tr[data-queue="orders.dlq"]')).to_have_count(1)
    expect(page.locator('#queue-table tr[data-queue="a.empty"]')).to_have_count(1)
    with ui_server.api() as api:
        assert api.get("/queues/orders").status_code == 404
        actions = {
            (e["action"], e["target"]) for e in api.get("/audit").json() if e["source"] == "ui"
        }
    for action in ("create", "snapshot", "compact", "redrive", "delete"):
        assert (f"queue.{action}", "orders" if action != "redrive" else "orders.dlq") in actions


def test_users_and_tokens(page: Page, ui_server: UiServer) -> None:
    log_in(page, ui_server, "admin", ADMIN_PASSWORD)
    page.goto(f"{ui_server.url}/users")
    no_reload_marker(page)
    form = page.locator("#add-user")
    form.locator('input[name="name"]').fill("auditor")
    form.locator('input[name="password"]').fill("auditor-password")
    form.locator('input[name="read"]').fill(".*")
    form.locator('button[type="submit"]').click()
    expect(page.locator("#flash")).to_contain_text("User auditor added")
    row = page.locator('#users-table tr[data-user="auditor"]')
    expect(row).to_have_count(1)
    row.locator('input[name="write"]').fill("reports\\..*")
    row.locator('button[type="submit"]').click()
    expect(page.locator("#flash")).to_contain_text("Permissions of auditor saved")

    page.select_option('#create-token select[name="user"]', "auditor")
    page.fill('#create-token input[name="name"]', "nightly-report")
    page.click('#create-token button[type="submit"]')
    secret = page.locator("#new-token").inner_text().strip()
    assert secret.startswith("qra_")
    token_row = page.locator("#tokens-table tbody tr", has_text="nightly-report")
    expect(token_row).to_have_count(1)
    screenshot(page, "06-users-and-tokens")
    whoami = httpx.get(
        f"{ui_server.url}/api/v1/whoami", headers={"Authorization": f"Bearer {secret}"}
    ).json()
    assert whoami["name"] == "auditor" and whoami["permissions"]["write"] == "reports\\..*"
    token_row.locator("button", has_text="Revoke").click()
    expect(page.locator("#flash")).to_contain_text("revoked")
    expect(token_row).to_have_count(0)
    revoked = httpx.get(
        f"{ui_server.url}/api/v1/whoami", headers={"Authorization": f"Bearer {secret}"}
    )
    assert revoked.status_code == 401
    assert_not_reloaded(page)


def test_without_configure_no_admin_buttons_and_server_refuses(
    page: Page, ui_server: UiServer
) -> None:
    with ui_server.api() as api:
        assert api.put("/queues/shared", json={"max_message_bytes": 4096}).status_code in (200, 201)
        response = api.post(
            "/users",
            json={
                "name": "operator",
                "password": "operator-password",
                "permissions": {"configure": "", "write": ".*", "read": ".*"},
            },
        )
        assert response.status_code in (201, 409), response.text
    log_in(page, ui_server, "operator", "operator-password")
    expect(page.locator("nav.tabs a", has_text="Users")).to_have_count(0)

    page.goto(f"{ui_server.url}/queues")
    expect(page.locator('#queue-table tr[data-queue="shared"]')).to_have_count(1)
    expect(page.locator("#create-queue")).to_have_count(0)
    expect(page.locator("#queue-table button")).to_have_count(0)

    page.goto(f"{ui_server.url}/queues/shared")
    for button in ("#take-snapshot", "#compact-now", "#delete", "#purge", "#redrive"):
        expect(page.locator(button)).to_have_count(0)
    page.fill('#publish-form textarea[name="body"]', "allowed: write permission")
    page.click("#publish")
    expect(page.locator("#depth-ready")).to_have_text("1")
    screenshot(page, "07-queue-without-configure")

    # The buttons are missing; the server refuses the requests anyway.
    csrf = json.loads(page.get_attribute("body", "hx-headers") or "{}")["X-CSRF-Token"]
    headers = {"X-CSRF-Token": csrf, "HX-Request": "true"}
    for path, form in (
        ("/queues/shared/snapshot", {}),
        ("/queues/shared/compact", {"phase": "auto"}),
        ("/queues/shared/purge", {}),
        ("/queues/shared/delete", {}),
        ("/queues/shared/redrive", {"target": "shared.other", "count": "1"}),
        ("/queues", {"name": "mine"}),
        ("/users", {"name": "sneaky", "password": "sneaky-password", "role": "admin"}),
        ("/tokens", {"user": "admin"}),
    ):
        refused = page.request.post(f"{ui_server.url}{path}", form=form, headers=headers)
        assert refused.status == 403, (path, refused.status, refused.text())
    assert page.request.get(f"{ui_server.url}/users").status == 403
    # Without the session's CSRF token, even a permitted action is refused.
    forged = page.request.post(
        f"{ui_server.url}/queues/shared/publish", form={"body": "x"}, headers={"HX-Request": "true"}
    )
    assert forged.status == 403
    with ui_server.api() as api:
        assert api.get("/queues/shared").json()["stats"]["messages_ready"] == 1
        assert api.get("/users/sneaky").status_code == 404


def test_live_parts_poll_only_while_the_tab_is_visible(page: Page, ui_server: UiServer) -> None:
    log_in(page, ui_server, "admin", ADMIN_PASSWORD)
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if "/fragments/" in r.url else None)
    page.wait_for_timeout(2500)
    assert polls, "the overview did not poll while visible"
    page.evaluate(
        """() => {
            Object.defineProperty(document, "visibilityState", {value: "hidden", configurable: true});
            document.dispatchEvent(new Event("visibilitychange"));
        }"""
    )
    page.wait_for_timeout(300)  # a poll already on its way may still finish
    polls.clear()
    page.wait_for_timeout(4500)
    assert polls == [], "a hidden tab kept polling"
    with page.expect_request(lambda r: "/fragments/overview" in r.url, timeout=1000):
        page.evaluate(
            """() => {
                Object.defineProperty(document, "visibilityState", {value: "visible", configurable: true});
                document.dispatchEvent(new Event("visibilitychange"));
            }"""
        )
