"""The web UI in a real browser (issue 12): Debian's Chromium driven by Playwright, against
the real API and worker processes (SQLite, Redis), the LLM being the stub server.

The example incident is replayed through ``/turns`` while the dashboard is open; its
widgets must catch up by themselves (polling) and show exactly what ``GET /stats``
says. The session page must show the summary, expandable to the originals it replaced,
and "compact now" must queue a job that appears on the page and ends ``applied``.
Screenshots of each page go to ``test-output/ui/`` (gitignored).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from stack import ROOT, Stack, split_turns

from offpath.compaction.accounting import content_text

pytestmark = pytest.mark.usefixtures("stub")

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "test-output" / "ui"
INCIDENT = ROOT / "examples" / "incident-checkout-latency.json"
#: The incident (about 100,000 chars) is compacted once or twice on the way and ends under
#: the threshold, so the small turns added afterwards queue no job of their own.
ENV = {"SUMMARIZATION_THRESHOLD_CHARS": "50000", "SUMMARIZATION_KEEP_CHARS": "12000"}
#: How long the page may take to show a change (it polls every 2 s).
LIVE_MS = 20_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` (.ci/run installs it), "
            "or set CHROMIUM to its path",
            pytrace=False,
        )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def shots() -> Path:
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    return SHOTS


@pytest.fixture
def ui_stack(stacks) -> Stack:
    return stacks.get("sqlite", **ENV)


def logged_in(browser: Any, stack: Stack) -> Any:
    """A new page, logged in through the login form with the stack's admin key."""
    context = browser.new_context(viewport={"width": 1360, "height": 1000})
    page = context.new_page()
    page.goto(f"{stack.url}/ui")
    assert "/ui/login" in page.url  # no cookie yet: the dashboard sends us to log in
    page.fill("input[name=key]", stack.key)
    page.click("button[type=submit]")
    page.wait_for_url(f"{stack.url}/ui")
    return page


def flatten(body: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in body.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def shown(path: str, value: Any) -> str:
    """How the UI prints the figure at ``path`` (api/ui_data.shown): milliseconds rounded,
    in seconds from 1 s on; a share as a percentage; other figures with thousands separators."""
    if value is None:
        return "—"
    if path.rsplit(".", 1)[0].endswith("_ms"):  # lag_ms.p50 ...: a duration
        if round(value) < 1000:
            return f"{round(value):,} ms"
        if round(value / 100) < 600:
            return f"{value / 1000:.1f} s"
        minutes, seconds = divmod(round(value / 1000), 60)
        return f"{minutes:,} min {seconds:02d} s"
    if path.endswith(".share"):  # summaries_not_applied.share: 0..1
        return f"{round(value * 100, 1)}%"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}"


def widgets_of(page: Any) -> dict[str, tuple[Any, str]]:
    """``{stats path: (data-value, shown text)}`` of the dashboard's widgets."""
    found = page.eval_on_selector_all(
        "[data-stat]",
        "els => els.map(e => [e.dataset.stat, e.dataset.value, "
        "e.querySelector('.value').textContent.trim()])",
    )
    return {path: (json.loads(value), text) for path, value, text in found}


def stats_figures(stack: Stack, since: str | None = None) -> dict[str, Any]:
    """The numeric figures of ``/stats`` (``?since=``) by path (what the widgets must show)."""
    flat = flatten(stack.http.get("/stats", params={"since": since} if since else {}).json())
    return {
        k: v
        for k, v in flat.items()
        if v is None or (isinstance(v, int | float) and not isinstance(v, bool))
    }


def same_as_stats(page: Any, stack: Stack, since: str | None) -> dict[str, tuple[Any, str]]:
    """The dashboard's widgets, each checked against ``/stats?since=``: the same figure, shown
    as the UI prints it; returns them by path."""
    for _ in range(3):  # a reconciler pass may change a figure between the two reads
        seen = widgets_of(page)
        figures = stats_figures(stack, since)
        if {p: v for p, (v, _) in seen.items()} == {p: figures.get(p) for p in seen}:
            break
        page.reload()
    for path, (value, text) in seen.items():
        assert path in figures, f"widget {path} is not a /stats figure"
        assert value == figures[path], (path, value, figures[path])
        assert text == shown(path, figures[path]), (path, text)
    return seen


def thread_of(stack: Stack, session: str) -> list[Any]:
    """The thread as LangChain messages."""
    from langchain_core.messages import messages_from_dict

    answer = stack.http.get(f"/sessions/{session}/messages", params={"format": "langchain"})
    answer.raise_for_status()
    return messages_from_dict(answer.json()["messages"])


def replay(stack: Stack, session: str, turns: list[list[dict[str, Any]]]) -> None:
    """Post ``turns`` through ``/turns``, waiting after each for what the post-turn hook
    does (a job queued, a prepared compaction applied)."""
    settings = stack.settings()
    for turn in turns:
        jobs = stack.jobs(session)
        r = stack.post_turn(session, turn)
        assert r.status_code == 200, r.text
        thread = thread_of(stack, session)
        new_job, applies = stack.expect_after_turn(thread, jobs, settings)
        stack.settle(session, new_job, len(jobs), final=applies)


def more_turn(n: int, lines: int = 25) -> list[dict[str, Any]]:
    """One more turn of the investigation: a question, a tool call, its result (``lines``
    log lines of about 90 chars), an answer."""
    call = f"call-more-{n}-{uuid.uuid4().hex[:6]}"
    log = "\n".join(
        f"2025-03-11T14:{30 + n:02d}:{i % 60:02d}Z checkout-api-7c1e9-{i % 3} pool acquire "
        f"wait_ms={i * 7 % 90} in_use={i % 40}/40 waiting=0 follow-up={n}"
        for i in range(lines)
    )
    return [
        {
            "type": "human",
            "id": uuid.uuid4().hex,
            "content": f"Follow-up {n}: is the pool fix live?",
        },
        {
            "type": "ai",
            "id": uuid.uuid4().hex,
            "content": "",
            "tool_calls": [
                {"id": call, "name": "kubectl_logs", "args": {"namespace": "shop-prod", "n": n}}
            ],
        },
        {"type": "tool", "id": uuid.uuid4().hex, "tool_call_id": call, "content": log},
        {"type": "ai", "id": uuid.uuid4().hex, "content": f"Follow-up {n}: pool at 40, no waits."},
    ]


def test_login_keeps_the_key_in_a_strict_httponly_cookie(browser, ui_stack):
    stack = ui_stack
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{stack.url}/ui/sessions")
    page.fill("input[name=key]", "op_not-a-key")
    page.click("button[type=submit]")
    assert "unknown or revoked API key" in page.inner_text("[role=alert]")
    assert not context.cookies()
    page.fill("input[name=key]", stack.key)
    page.click("button[type=submit]")
    page.wait_for_url(f"{stack.url}/ui/sessions")  # back where the login started
    [cookie] = context.cookies()
    assert cookie["name"] == "offpath_key" and cookie["value"] == stack.key
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    # the JSON endpoints take the cookie; a state change with it needs the UI's header
    jar = {"offpath_key": stack.key}
    with httpx.Client(base_url=stack.url, cookies=jar) as plain:
        assert plain.get("/stats").status_code == 200
        refused = plain.post("/sessions/any/turns", json={"messages": []})
        assert refused.status_code == 403 and "X-Offpath-UI" in refused.json()["detail"]
    with httpx.Client(base_url=stack.url) as anonymous:  # no key: pages go to the login
        for path in ("/ui", "/ui/sessions?q=a", "/ui/sessions/s1"):
            r = anonymous.get(path)
            assert r.status_code == 303 and r.headers["location"].startswith("/ui/login?next=")
        assert anonymous.get("/ui/live/dashboard").status_code == 401
        assert anonymous.get("/ui/live/sessions/s1").status_code == 401
    with httpx.Client(base_url=stack.url) as plain:  # a login form posted from another site
        cross = plain.post(
            "/ui/login", data={"key": stack.key}, headers={"Origin": "https://elsewhere.example"}
        )
        assert cross.status_code == 403 and "set-cookie" not in cross.headers
    page.click("form.logout button")
    page.wait_for_url(f"{stack.url}/ui/login")
    assert not context.cookies()
    context.close()


def test_dashboard_sessions_list_and_session_page_in_a_browser(browser, ui_stack, shots, stub):
    stack = ui_stack
    session = f"ui-{uuid.uuid4().hex[:8]}"
    page = logged_in(browser, stack)

    # --- a job that fails (the LLM answers nothing), for the recent failures -----------------
    doc = json.loads(INCIDENT.read_text())
    turns = split_turns(doc["messages"])
    failing = f"ui-fail-{uuid.uuid4().hex[:8]}"
    with stub.state.lock:
        stub.state.mode = "empty"
    try:
        for turn in turns:  # until the hook queues a job
            jobs = stack.jobs(failing)
            assert stack.post_turn(failing, turn).status_code == 200
            thread = thread_of(stack, failing)
            if stack.expect_after_turn(thread, jobs, stack.settings())[0]:
                [failed] = stack.settle(failing, True, 0)
                break
        assert failed["status"] == "failed", failed
    finally:
        with stub.state.lock:
            stub.state.mode = "ok"

    # --- the dashboard follows a replay by itself, and shows exactly /stats ----------------
    before = stats_figures(stack)
    replay(stack, session, turns)
    figures = stats_figures(stack)
    assert figures["summary.total_summarizations"] > before["summary.total_summarizations"]
    page.wait_for_function(
        "n => Number(document.querySelector('[data-stat=\"summary.total_summarizations\"]')"
        ".dataset.value) >= n",
        arg=figures["summary.total_summarizations"],
        timeout=LIVE_MS,
    )  # no reload: the page polled
    wanted = {
        "summary.sessions_compacted",
        "summary.approx_tokens_saved",
        "summary.total_chars_compacted",
        "summary.fallback_maskings",
        *(
            f"summary.jobs.{s}"
            for s in ("queued", "running", "prepared", "applied", "skipped", "failed")
        ),
        *(f"summary.{f}.{p}" for f in ("lag_ms", "summarizer_latency_ms") for p in ("p50", "p99")),
        *(f"summary.summaries_not_applied.{p}" for p in ("waiting", "dropped", "share")),
    }
    for since in (None, "1h"):
        page.goto(f"{stack.url}/ui" + (f"?since={since}" if since else ""))
        seen = same_as_stats(page, stack, since)
        assert wanted <= set(seen), f"no widget for {sorted(wanted - set(seen))}"
    page.goto(f"{stack.url}/ui")
    failure = page.locator(f'tr.failure[data-job-id="{failed["job_id"]}"]')
    assert failed["reason_code"] and failed["reason_code"] in failure.inner_text()
    series = page.locator(f'svg.chart g.series[data-session="{session}"]')
    assert series.locator("polyline").count() == 1
    dots = series.locator("circle title").evaluate_all("els => els.map(e => e.textContent)")
    applied = [j for j in stack.jobs(session) if j["status"] == "applied"]
    assert sum("applied: after (" in t for t in dots) == len(applied) > 0
    assert dots[-1].startswith(f"{session}: {stack.session(session)['chars']:,} chars now ("), dots
    # the replay took about a second: its line still runs from the chart's left to its right
    xs = series.locator("circle").evaluate_all("els => els.map(e => Number(e.getAttribute('cx')))")
    chart_box = page.locator("svg.chart").evaluate("e => e.viewBox.baseVal.width")
    assert min(xs) < 0.1 * chart_box and max(xs) > 0.9 * chart_box, xs
    check_dashboard_polish(page, stack)
    page.screenshot(path=str(shots / "dashboard.png"), full_page=True)

    # --- the sessions list: searchable by id, sortable -----------------------------------------
    page.goto(f"{stack.url}/ui/sessions")
    page.fill("input[type=search]", session)
    page.press("input[type=search]", "Enter")
    page.wait_for_url("**/ui/sessions?q=*")
    rows = page.locator("table.sessions tbody tr")
    assert rows.count() == 1 and rows.first.get_attribute("data-session") == session
    size = stack.session(session)["chars"]
    assert rows.first.locator("[data-chars]").get_attribute("data-chars") == str(size)
    page.screenshot(path=str(shots / "sessions.png"), full_page=True)
    page.goto(f"{stack.url}/ui/sessions?sort=chars&order=asc")
    sizes = [
        int(c)
        for c in page.locator("table.sessions [data-chars]").evaluate_all(
            "els => els.map(e => e.dataset.chars).filter(c => c !== 'None')"
        )
    ]
    assert sizes == sorted(sizes) and size in sizes

    # --- the session: summary marked, expandable to the originals it replaced ----------------
    page.click(f'a[href="/ui/sessions/{session}"]')
    page.wait_for_url(f"**/ui/sessions/{session}")
    thread = stack.messages(session)
    posted = {m["id"]: m for m in doc["messages"]}
    removed = [i for i in posted if i not in {m["id"] for m in thread}]
    assert removed, "the replay compacted nothing"
    # its figures are GET /sessions/{id}/stats's
    figures_here = flatten(stack.http.get(f"/sessions/{session}/stats").json())
    here = page.eval_on_selector_all(
        "[data-region=header] [data-stat]", "els => els.map(e => [e.dataset.stat, e.dataset.value])"
    )
    assert {p for p, _ in here} >= {"summary.total_chars_compacted", "summary.jobs.failed"}
    assert all(json.loads(v) == figures_here[p] for p, v in here), (here, figures_here)
    summary = page.locator("[data-region=thread] > article.msg.summary")
    assert summary.count() == 1
    assert "[Context from earlier in this session, summarized]" in summary.inner_text()
    check_summary_counts(summary, stack, session)
    # no failed job here: its count is not drawn in red
    failed_here = page.locator('[data-region=header] [data-stat="summary.jobs.failed"]')
    assert failed_here.get_attribute("data-value") == "0"
    assert not is_red(failed_here.locator(".value"))
    # a removed message, word for word, is in the archive behind the summary, folded away: a
    # request if the compaction removed one (how deep it cuts depends on the run's growth per
    # step, issue 18), else the first removed message with text
    request = next((posted[i] for i in removed if posted[i]["type"] == "human"), None) or next(
        posted[i] for i in removed if content_text(posted[i].get("content") or "").strip()
    )
    original = summary.locator(f'details.originals article[data-message-id="{request["id"]}"]')
    assert original.count() == 1 and not original.is_visible()
    summary.locator("details.originals > summary").click()
    assert original.is_visible()
    assert content_text(request["content"])[:120] in original.inner_text()
    # a tool call is folded, its arguments and result inside
    call = page.locator("[data-region=thread] > article.msg.ai details.call").first
    assert not call.locator("pre.result").is_visible()
    call.locator("summary").click()
    assert call.locator("pre.result").is_visible()
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(shots / "session.png"), full_page=False)
    page.context.close()

    # --- a phone's width: nothing wider than the screen; a thread over its threshold marked ----
    over = f"ui-over-{uuid.uuid4().hex[:6]}"
    pasted = "\n".join(
        f"14:{k % 60:02d}:07Z checkout-api GET /cart 200 {k} ms" for k in range(1500)
    )
    assert stack.post_turn(over, [{"type": "human", "content": pasted}]).status_code == 200
    threshold = int(ENV["SUMMARIZATION_THRESHOLD_CHARS"])
    assert stack.session(over)["chars"] > threshold
    phone = browser.new_context(viewport={"width": 390, "height": 900})
    phone.add_cookies([{"name": "offpath_key", "value": stack.key, "url": stack.url}])
    small = phone.new_page()
    for name, path in (
        ("dashboard", "/ui"),
        ("sessions", "/ui/sessions"),
        ("session", f"/ui/sessions/{session}"),
    ):
        small.goto(stack.url + path)
        if name == "sessions":
            row = small.locator(f'tr[data-session="{over}"]')
            assert row.get_attribute("data-over") is not None
            assert "×" in row.locator(".badge.over").inner_text()
            marked = small.locator("table.sessions tbody tr").evaluate_all(
                "els => els.map(e => [e.dataset.over !== undefined,"
                " Number(e.querySelector('[data-chars]').dataset.chars) || 0])"
            )
            assert all(flag == (chars > threshold) for flag, chars in marked), marked
        widths = small.evaluate(
            "() => ({page: document.documentElement.scrollWidth,"
            " header: Math.max(...Array.from(document.querySelectorAll('header.top > *'),"
            " e => e.getBoundingClientRect().right))})"
        )
        assert widths["page"] <= 390 and widths["header"] <= 390, (name, widths)
        small.screenshot(path=str(shots / f"phone-{name}.png"), full_page=True)
    small.goto(f"{stack.url}/ui/sessions/{over}")
    assert small.locator("[data-region=header] [data-over]").count() == 1
    phone.close()


def is_red(locator: Any) -> bool:
    """The element's text colour is the UI's "bad" red (--bad, #dc2626)."""
    return locator.evaluate("e => getComputedStyle(e).color") == "rgb(220, 38, 38)"


def check_dashboard_polish(page: Any, stack: Stack) -> None:
    """Issue 21, item 11, on the dashboard as it is: labels are words (no JSON key), the
    failed count is red because it is not 0, "sessions compacted" is the number of
    compacted sessions the Sessions page lists, the chart fills its card, its ticks are round
    and its threshold label is whole and on top."""
    labels = page.locator(".widget .label").all_inner_texts()
    assert labels and not [t for t in labels if "_" in t or " ms" in t or "count" in t], labels
    failed = page.locator('[data-stat="summary.jobs.failed"]')
    assert int(failed.get_attribute("data-value")) > 0 and is_red(failed.locator(".value"))
    compacted = page.locator('[data-stat="summary.sessions_compacted"]').get_attribute("data-value")
    page.goto(f"{stack.url}/ui/sessions")
    listed = page.locator("p.counts").get_attribute("data-compacted")
    assert int(compacted) == int(listed), (compacted, listed)
    page.goto(f"{stack.url}/ui")
    # a function, not an expression: Playwright evals an expression string in the page, which the
    # UI's CSP (script-src 'self') refuses once the first check fails and polling begins
    page.wait_for_function(
        "() => document.getElementById('live-status').textContent.startsWith('live')"
    )
    svg = page.locator("svg.chart")
    width, room = svg.evaluate(  # one call: a later poll may replace the chart between two
        "e => [e.getBoundingClientRect().width, e.parentNode.parentNode.clientWidth - 32]"
    )
    assert width >= 0.9 * room, (width, room)
    ticks = [
        float(t.removesuffix("k")) * (1000 if t.endswith("k") else 1)
        for t in page.locator("svg.chart text.tick").evaluate_all(
            "els => els.map(e => e.textContent.trim())"
        )
        if t and t[0].isdigit()
    ]
    steps = {b - a for a, b in zip(ticks, ticks[1:], strict=False)}
    assert ticks[0] == 0 and len(steps) == 1, ticks  # 0, 20k, 40k, ...: one step
    assert steps.pop() in {m * 10**k for m in (1, 2, 2.5, 5) for k in range(2, 7)}, ticks
    label = page.locator("svg.chart text.threshold-label")
    box = label.evaluate("e => { const b = e.getBBox(); return [b.x, b.y, b.width, b.height] }")
    view = svg.evaluate("e => [e.viewBox.baseVal.width, e.viewBox.baseVal.height]")
    assert box[0] >= 0 and box[1] >= 0 and box[0] + box[2] <= view[0], (box, view)
    assert label.evaluate("e => e === e.parentNode.lastElementChild")  # drawn over the lines


def check_summary_counts(summary: Any, stack: Stack, session: str) -> None:
    """The summary card says once how many messages it replaced, in how many compactions,
    and both are right: the archived originals no longer in the thread (not the summaries
    folded in, nor the kept results shortened), and the session's applied compactions."""
    from offpath.compaction.summary import SUMMARY_PREFIX

    thread = {
        m["id"] for m in stack.messages(session) if not str(m["content"]).startswith(SUMMARY_PREFIX)
    }
    rows = stack.http.get(f"/sessions/{session}/archive", params={"limit": 500}).json()["messages"]
    replaced = {
        r["message_id"]
        for r in rows
        if r["message_id"] not in thread and not str(r["content"]).startswith(SUMMARY_PREFIX)
    }
    applied = [j for j in stack.jobs(session) if j["status"] == "applied"]
    assert {r["job_id"] for r in rows} - {None} == {j["job_id"] for j in applied}
    head = summary.locator(":scope > details.originals > summary")
    assert int(head.get_attribute("data-replaced")) == len(replaced) > 0
    assert int(head.get_attribute("data-compactions")) == len(applied)
    text = head.inner_text()
    assert f"{len(replaced)} messages in {len(applied)} compaction" in text, text
    assert "replaces" not in summary.locator(":scope > header").inner_text()


def test_compact_now_queues_a_job_that_appears_and_ends_applied(browser, ui_stack, shots):
    stack = ui_stack
    session = f"ui-now-{uuid.uuid4().hex[:8]}"
    doc = json.loads(INCIDENT.read_text())
    replay(stack, session, split_turns(doc["messages"]))
    page = logged_in(browser, stack)
    page.goto(f"{stack.url}/ui/sessions/{session}")
    page.locator("[data-region=thread] > article.msg.summary details.originals > summary").click()

    # --- more turns, then "compact now": the job appears and ends applied --------------------
    known = {j["job_id"] for j in stack.jobs(session)}
    live = f"/ui/live/sessions/{session}"
    first = stack.http.get(live).json()
    assert session in first["regions"]["header"] and first["version"]
    # polling an unchanged session renders nothing
    assert stack.http.get(live, params={"v": first["version"]}).json() == {
        "regions": {},
        "version": first["version"],
    }
    replay(stack, session, [more_turn(n, lines=5) for n in range(4)])  # under the prepare point
    after = stack.http.get(live, params={"v": first["version"]}).json()
    assert after["version"] != first["version"] and "Follow-up 3" in after["regions"]["thread"]
    assert {j["job_id"] for j in stack.jobs(session)} == known, "the new turns queued a job"
    page.click("#compact-now")
    page.wait_for_function(
        "() => !['', 'queueing...'].includes(document.getElementById('compact-result').textContent)",
        timeout=LIVE_MS,
    )
    job_id = page.get_attribute("#compact-result", "data-job-id")
    assert job_id and job_id not in known, page.inner_text("#compact-result")
    job = page.locator(f'li.job[data-job-id="{job_id}"]')
    job.wait_for(timeout=LIVE_MS)  # appears without a reload
    page.wait_for_selector(f'li.job[data-job-id="{job_id}"][data-status="applied"]', timeout=60_000)
    assert [j["status"] for j in stack.jobs(session) if j["job_id"] == job_id] == ["applied"]
    assert job.locator(".forced").inner_text() == "compact now"
    # issue 21, item 4: the page heard it live (GET /sessions/{id}/events), queued and then
    # completed with its sizes
    done = page.locator(f'#compaction-events li[data-job="{job_id}"][data-status="completed"]')
    done.wait_for(timeout=LIVE_MS)
    assert " chars" in done.inner_text() and "→" in done.inner_text()
    assert page.locator(f'#compaction-events li[data-job="{job_id}"]').count() == 2
    # the button's own line follows its job: no "queued" left beside an applied job
    page.wait_for_selector('#compact-result[data-status="completed"]', timeout=LIVE_MS)
    assert page.inner_text("#compact-result").startswith(f"job {job_id[:8]} completed: ")
    page.wait_for_function(
        "id => document.querySelector('details.originals section.compaction[data-job-id=\"' + id + '\"]')",
        arg=job_id,
        timeout=LIVE_MS,
    )  # the thread was refreshed too: the new compaction's originals are behind the summary
    originals = page.locator("[data-region=thread] > article.msg.summary > details.originals")
    assert originals.get_attribute("open") is not None  # stayed open across the refresh
    page.screenshot(path=str(shots / "session-compacted.png"), full_page=False)

    # --- delete: after a confirmation, the session and its rows are gone ----------------------
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#delete-session")
    page.wait_for_url(f"{stack.url}/ui/sessions")
    assert page.locator(f'tr[data-session="{session}"]').count() == 0
    assert stack.http.get(f"/sessions/{session}/messages").status_code == 404
    page.context.close()


def test_session_of_another_tenant_is_not_found(browser, ui_stack):
    stack = ui_stack
    mine = f"ui-other-{uuid.uuid4().hex[:6]}"
    assert stack.post_turn(mine, more_turn(0, lines=2)).status_code == 200
    key = stack.create_key(f"t-{uuid.uuid4().hex[:6]}")
    context = browser.new_context()
    context.add_cookies([{"name": "offpath_key", "value": key, "url": stack.url}])
    page = context.new_page()
    answer = page.goto(f"{stack.url}/ui/sessions/{mine}")
    assert answer.status == 404
    page.goto(f"{stack.url}/ui/sessions")
    assert page.locator(f'tr[data-session="{mine}"]').count() == 0
    context.close()


def test_a_page_query_it_cannot_read_is_a_page_that_says_why(browser, ui_stack, shots):
    """``/ui?since=bogus``, a forged sessions cursor, an unknown sort or order: a 422 page
    naming the parameter, with a link back to the page without it (not the API's JSON)."""
    page = logged_in(browser, ui_stack)
    for path, back, word in (
        ("/ui?since=bogus", "/ui", "since"),
        ("/ui/sessions?cursor=forged", "/ui/sessions", "cursor"),
        ("/ui/sessions?sort=bogus", "/ui/sessions", "sort"),
        ("/ui/sessions?sort=chars&order=sideways", "/ui/sessions", "order"),
        # what FastAPI refuses before a page runs (was the API's JSON): a thread id that is
        # none, said in words, not as its pattern; a NUL in a query
        ("/ui/sessions/a%20b", "/ui/sessions", "a thread id is 1-128 letters"),
        ("/ui/sessions/" + "x" * 200, "/ui/sessions", "session_id"),
        ("/ui/sessions?q=%00", "/ui/sessions", "q"),
        ("/ui?since=%00", "/ui", "since"),
    ):
        answer = page.goto(f"{ui_stack.url}{path}")
        assert answer.status == 422, path
        assert answer.headers["content-type"].startswith("text/html"), (path, page.content()[:300])
        assert word in page.locator("main").inner_text(), page.content()[:500]
        assert "pattern" not in page.locator("main").inner_text()
        name = re.sub(r"\W+", "-", path.strip("/"))[:40]
        page.screenshot(path=str(shots / f"bad-query-{name}.png"), full_page=True)
        page.click("main a")
        page.wait_for_url(f"{ui_stack.url}{back}")
    page.context.close()


def test_revert_button_puts_the_latest_compaction_back(browser, ui_stack):
    """Issue 19: the session page's latest applied compaction has a Revert button; after a
    confirmation the job reads ``reverted``, the button is gone and the thread is the one
    before the compaction."""
    stack = ui_stack
    session = f"ui-revert-{uuid.uuid4().hex[:8]}"
    replay(stack, session, [more_turn(n) for n in range(6)])
    before = stack.http.get(f"/sessions/{session}/messages", params={"format": "langchain"})
    r = stack.http.post(f"/sessions/{session}/compact")
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    stack.settle(session, False, 0, final=job_id)
    page = logged_in(browser, stack)
    page.goto(f"{stack.url}/ui/sessions/{session}")
    job = page.locator(f'li.job[data-job-id="{job_id}"][data-status="applied"]')
    assert "facts lost" in job.inner_text()
    page.once("dialog", lambda dialog: dialog.accept())
    job.locator("button.revert").click()
    page.wait_for_selector(
        f'li.job[data-job-id="{job_id}"][data-status="reverted"]', timeout=LIVE_MS
    )
    assert "reverted" in page.inner_text("#revert-result")
    assert page.locator("button.revert").count() == 0
    after = stack.http.get(f"/sessions/{session}/messages", params={"format": "langchain"})
    assert after.json()["messages"] == before.json()["messages"]
    page.context.close()


#: What the width test reports about a page: its scroll width, and each element wider than
#: the screen that is not inside a box that scrolls (and fits) with a visible hint beside it.
OVERFLOW_JS = """w => {
  const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
    + (typeof e.className === 'string' && e.className ? '.' + e.className.split(' ').join('.') : '');
  const bad = new Set(), scrolled = new Set();
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.right <= w + 0.5) continue;
    let box = e.parentElement;
    while (box && !['auto', 'scroll'].includes(getComputedStyle(box).overflowX)) box = box.parentElement;
    if (!box || box.getBoundingClientRect().right > w + 0.5) { bad.add(name(e)); continue; }
    const hint = box.parentElement.querySelector('[data-scroll-hint]');
    if (!hint || hint.offsetParent === null) bad.add('no visible hint beside ' + name(box));
    else scrolled.add(name(box));
  }
  return {page: document.documentElement.scrollWidth, bad: [...bad].slice(0, 10),
          scrolled: [...scrolled]};
}"""


def test_every_page_fits_a_phone_at_390_px_and_a_desktop_at_1280(browser, ui_stack, shots):
    """Issue 35, items 2 and 5: at 390 px (a phone) no page is wider than the screen: the
    sessions list and the recent failures become one card per row, every cell labelled and
    on screen; the size chart scrolls inside its own box with a visible hint. At 1280 px the
    tables are tables and no hint shows. A queued job no worker took is said on its
    session's page, naming the queue and the broker."""
    from offpath.agent.middleware.claims import PICKUP_WARN_S
    from offpath.stores.db.engine import make_engine
    from offpath.stores.db.tables import JOBS, JobStatus, now_utc
    from offpath.stores.db.transitions import create_job, set_job

    stack = ui_stack
    session = f"ui-width-{uuid.uuid4().hex[:6]}-a-long-incident-session-id-from-a-pager"
    replay(stack, session, split_turns(json.loads(INCIDENT.read_text())["messages"]))
    over = f"ui-width-over-{uuid.uuid4().hex[:6]}"
    pasted = "\n".join(
        f"14:{k % 60:02d}:07Z checkout-api GET /cart 200 {k} ms" for k in range(1500)
    )
    assert stack.post_turn(over, [{"type": "human", "content": pasted}]).status_code == 200
    # a failed job (the recent failures) and a job queued a minute ago that no worker took
    waiting, failed = f"ui-waiting-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    engine = make_engine(stack.settings())
    try:
        create_job(engine, failed, over, 70_000)
        set_job(engine, failed, over, JobStatus.FAILED, "summarizer timed out", "timeout")
        create_job(engine, waiting, waiting, 70_000)
        with engine.begin() as conn:
            conn.execute(
                JOBS.update()
                .where(JOBS.c.job_id == waiting)
                .values(created_at=now_utc() - timedelta(seconds=PICKUP_WARN_S + 50))
            )
    finally:
        engine.dispose()
    pages = {
        "dashboard": "/ui",
        "sessions": "/ui/sessions",
        "session": f"/ui/sessions/{session}",
        "over": f"/ui/sessions/{over}",
        "waiting": f"/ui/sessions/{waiting}",
        "not-found": "/ui/sessions/no-such-session",
    }
    for width in (390, 1280):
        context = browser.new_context(viewport={"width": width, "height": 900})
        anonymous = context.new_page()
        anonymous.goto(f"{stack.url}/ui/login")
        assert anonymous.evaluate(OVERFLOW_JS, width) == {"page": width, "bad": [], "scrolled": []}
        anonymous.screenshot(path=str(shots / f"{width}-login.png"), full_page=True)
        context.add_cookies([{"name": "offpath_key", "value": stack.key, "url": stack.url}])
        page = context.new_page()
        for name, path in pages.items():
            page.goto(stack.url + path)
            # folded tool calls, their results and the originals a summary replaced: open
            page.evaluate("document.querySelectorAll('details').forEach(d => { d.open = true })")
            found = page.evaluate(OVERFLOW_JS, width)
            assert found["page"] <= width and not found["bad"], (width, name, found)
            hints = page.locator("[data-scroll-hint]")
            shown = [hints.nth(i).is_visible() for i in range(hints.count())]
            if width == 390:  # the chart is the one box that scrolls, its hint beside it
                assert found["scrolled"] == (["div.chart-wrap"] if name == "dashboard" else [])
                assert shown == ([True] if name == "dashboard" else [])
            else:
                assert not found["scrolled"] and not any(shown), (name, found)
            page.screenshot(path=str(shots / f"{width}-{name}.png"), full_page=True)
            if name == "sessions":
                cells = page.locator(f'tr[data-session="{session}"] td')
                boxes = cells.evaluate_all(
                    "els => els.map(e => e.getBoundingClientRect().toJSON())"
                )
                assert len(boxes) == 7 and all(b["right"] <= width for b in boxes), boxes
                lefts = {round(b["left"]) for b in boxes}
                # a card stacks its cells (one left edge); a table row lines them up
                assert (len(lefts) == 1) == (width == 390), boxes
                if width == 390:
                    labels = cells.evaluate_all(
                        "els => els.map(e => getComputedStyle(e, '::before').content)"
                    )
                    assert labels[1:] == [
                        f'"{label}"'
                        for label in (
                            "tenant",
                            "messages",
                            "size (chars)",
                            "compactions",
                            "jobs in flight",
                            "last activity",
                        )
                    ], labels
                    assert page.locator("thead a[data-sort=chars]").is_visible()
            if name == "dashboard":
                assert page.locator(f'tr.failure[data-job-id="{failed}"]').is_visible()
            if name == "session":  # issue 35, item 3: tokens beside chars
                tokens = page.locator("[data-fact=tokens]").inner_text()
                assert tokens.endswith(" tokens") and int(tokens.split()[0].replace(",", ""))
            if name == "waiting":
                said = page.locator(f'[data-waiting="{waiting}"]').inner_text()
                settings = stack.settings()
                assert f"in queue {settings.celery_queue}" in said, said
                assert f"broker at {settings.broker_url}" in said, said
                assert "offpath worker" in said
            else:
                assert page.locator("[data-waiting]").count() == 0
        context.close()
