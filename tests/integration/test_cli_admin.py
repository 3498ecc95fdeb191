"""The session admin commands as a user runs them (issue 12): ``offpath sessions``, ``offpath
compact ID`` and ``offpath show ID`` against a running API and worker; errors are one line
and exit 1."""

from __future__ import annotations

import uuid

import httpx

from integration.test_admin import CASE_SETTINGS, post_turns
from integration.test_cli import run


def test_sessions_compact_and_show_against_a_running_api(stacks, stub):
    stack = stacks.get("sqlite", **CASE_SETTINGS)
    run_id = uuid.uuid4().hex[:6]
    key = stack.create_key(f"cli-{run_id}")
    env = {"OFFPATH_API_KEY": key, "API_URL": stack.url}
    session = f"cli-adm-{run_id}"
    with httpx.Client(
        base_url=stack.url, timeout=30, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        post_turns(http, session, 5, 4_000)

    listed = run(["sessions"], env=env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert session in listed.stdout and f"cli-{run_id}" in listed.stdout

    compacted = run(["compact", session], env=env)
    assert compacted.returncode == 0, compacted.stdout + compacted.stderr
    assert "queued" in compacted.stdout and "applied: -" in compacted.stdout

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
    wrong_key = run(["sessions"], env={**env, "OFFPATH_API_KEY": "op_wrong"})
    assert wrong_key.returncode == 1 and "refused the key" in wrong_key.stderr
