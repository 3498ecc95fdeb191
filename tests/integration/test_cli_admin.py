"""The session admin commands as a user runs them (issue 12): ``offpath sessions``, ``offpath
compact ID`` and ``offpath show ID`` against a running API and worker; errors are one line
and exit 1."""

from __future__ import annotations

import re
import shlex
import uuid

import httpx

from integration.test_admin import CASE_SETTINGS, post_turns, turn
from integration.test_cli import run


def test_sessions_compact_and_show_against_a_running_api(stacks, stub):
    stack = stacks.get("sqlite", **CASE_SETTINGS)
    run_id = uuid.uuid4().hex[:6]
    key = stack.create_key(f"cli-{run_id}")
    env = {"OFFPATH_API_KEY": key, "API_URL": stack.url}
    session = f"cli-adm-{run_id}"
    # issue 21, item 1: an empty list says how sessions come to be listed
    empty = run(["sessions"], env={**env, "OFFPATH_API_KEY": stack.create_key(f"no-{run_id}")})
    assert empty.returncode == 0 and "no sessions" in empty.stdout, empty.stdout + empty.stderr
    assert "OffPathCompaction" in empty.stdout and "OWN_AGENT_TENANT" in empty.stdout
    with httpx.Client(
        base_url=stack.url, timeout=30, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        post_turns(http, session, 5, 4_000)

    listed = run(["sessions"], env=env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert session in listed.stdout and f"cli-{run_id}" in listed.stdout

    # a page's "more:" line is the command for the next page with the same options
    others = [f"cli-adm{n}-{run_id}" for n in (2, 3)]
    with httpx.Client(
        base_url=stack.url, timeout=30, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        for other in (*others, f"unlisted-{uuid.uuid4().hex[:6]}"):  # the last not matching -q
            post_turns(http, other, 1, 400)
    pages = [run(["sessions", "--limit", "1", "-q", f"-{run_id}"], env=env).stdout]
    while more := [ln for ln in pages[-1].splitlines() if ln.startswith("more: ")]:
        args = shlex.split(more[0].removeprefix("more: "))
        assert args[0] == "offpath" and len(pages) < 5, more
        pages.append(run(args[1:], env=env).stdout)
    per_page = [[s for s in (session, *others) if s in page] for page in pages]
    assert sorted(map(len, per_page)) == [1, 1, 1], pages  # one per page, each once
    assert not any("unlisted-" in page for page in pages), pages

    compacted = run(["compact", session], env=env)
    assert compacted.returncode == 0, compacted.stdout + compacted.stderr
    assert "queued" in compacted.stdout and "applied: -" in compacted.stdout
    jobs = httpx.get(
        f"{stack.url}/sessions/{session}/compactions",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ).json()["jobs"]
    [done] = [j for j in jobs if j["status"] == "applied"]
    # the figure is the thread's real reduction, not the chars the summary replaced
    assert done["chars_saved"] < done["chars_removed"]
    assert f"applied: -{done['chars_saved']:,} chars (" in compacted.stdout, compacted.stdout

    shown = run(["show", session, "--width", "60"], env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"{session}: ")
    assert lines[1].startswith("#0 summary ")  # the thread as the model sees it
    assert "-> get_logs(" in shown.stdout and "<- c4" in shown.stdout
    assert "applied" in shown.stdout.split("jobs", 1)[1]

    again = run(["compact", session], env=env)
    assert again.returncode == 1
    err = again.stderr.strip()
    assert "nothing to compact" in err and len(err.splitlines()) == 1, err

    for args, expected in (
        (["show", "no-such-session"], "404"),
        (["compact", "no-such-session"], "404"),
        (["sessions", "--sort", "size"], "422"),
        (["sessions", "--url", "http://127.0.0.1:9"], "cannot reach the API"),
    ):
        r = run(args, env=env)
        err = r.stderr.strip()
        assert r.returncode == 1 and expected in err and len(err.splitlines()) == 1, (args, err)
    for command in (["stats"], ["sessions"], ["show", session]):  # no scheme: said, exit 2
        r = run([*command, "--url", stack.url.removeprefix("http://")], env=env)
        assert r.returncode == 2 and "http://" in r.stderr, (command, r.stderr)
        assert "unsupported protocol" not in r.stderr, r.stderr
    wrong_key = run(["sessions"], env={**env, "OFFPATH_API_KEY": "op_wrong"})
    assert wrong_key.returncode == 1 and "refused the key" in wrong_key.stderr
    # issue 35, item 6: the hint how to make a key, once (the API's 401 says it as well)
    for key in ("", "op_wrong"):
        r = run(["stats"], env={**env, "OFFPATH_API_KEY": key})
        err = r.stderr.strip()
        assert r.returncode == 1 and len(err.splitlines()) == 1, err
        assert err.count("keys create") == 1 and "OFFPATH_API_KEY" in err, err
        assert ("no API key was sent" in err) == (not key), err


def test_sessions_keeps_ids_whole_and_counts_in_words(stacks, stub):
    """Issue 21, item 12: at 80 columns `offpath sessions` cut ids ("incident-…") so they
    could not be copied, and the CLI said "1 messages", "1 compactions". Ids now stay whole
    at any width (a table whose other columns give way, or an id on a line of its own), and
    counts agree with their nouns. A setting of the service the client does not read (a
    keep window over the threshold) does not stop `offpath stats` either."""
    stack = stacks.get("sqlite", **CASE_SETTINGS)
    run_id = uuid.uuid4().hex[:6]
    key = stack.create_key(f"ids-{run_id}")
    env = {"OFFPATH_API_KEY": key, "API_URL": stack.url}
    long_id = f"incident-checkout-latency-{run_id}-2025-03-11-prod-eu-1"
    short_id = f"one-{run_id}"
    with httpx.Client(
        base_url=stack.url, timeout=30, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        post_turns(http, long_id, 5, 4_000)
        r = http.post(f"/sessions/{short_id}/turns", json={"messages": turn(0, 100)[:1]})
        assert r.status_code == 200, r.text
    compacted = run(["compact", long_id], env=env)
    assert compacted.returncode == 0, compacted.stdout + compacted.stderr
    assert " 1 messages " not in compacted.stdout

    for columns in ("80", "200"):
        listed = run(["sessions"], env={**env, "COLUMNS": columns})
        out = listed.stdout
        assert listed.returncode == 0, out + listed.stderr
        assert "…" not in out and "..." not in out, out
        lines = [line.rstrip() for line in out.splitlines()]
        for sid in (long_id, short_id):
            # whole, as a line of its own or as the first cell of a table row
            assert any(line.split()[:1] == [sid] for line in lines if line), (sid, out)
        assert lines[0] == f"tenant ids-{run_id}", out  # one tenant: said once, above
    narrow = run(["sessions"], env={**env, "COLUMNS": "80"}).stdout
    assert long_id in narrow.splitlines(), narrow  # too long for a table at 80: its own line
    assert re.search(r"\b1 message\b", narrow) and re.search(r"\b1 compaction\b", narrow)
    assert not re.search(r"\b1 (messages|compactions)\b", narrow), narrow

    shown = run(["show", short_id], env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"{short_id}: 1 message, "), shown.stdout

    empty = run(["sessions", "-q", f"none-{run_id}"], env=env)
    assert (
        empty.returncode == 0
        and empty.stdout.strip() == f"no sessions whose id contains 'none-{run_id}'"
    )

    stats = run(["stats"], env={**env, "SUMMARIZATION_KEEP_CHARS": "90000"})
    assert stats.returncode == 0, stats.stderr
    assert "total_summarizations" in stats.stdout
