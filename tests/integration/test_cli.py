"""The command line as a user runs it (issue 4): the demo on embedded defaults, replay
against a running API, stats, and one clear line for wrong files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest
from shared import TRANSCRIPTS
from stack import ROOT, free_port

pytestmark = pytest.mark.usefixtures("stub")

OFFPATH = [sys.executable, "-m", "cli.main"]


def run(args, env=None, timeout=180):
    return subprocess.run(
        OFFPATH + args,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "120", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def children_of_demo():
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if any("demo-" in a for a in (p.info["cmdline"] or []))
    ]


@pytest.mark.parametrize("broker", ["redis", "embedded"])
def test_demo_runs_to_the_end_and_leaves_no_process(broker):
    env = {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"} if broker == "embedded" else {}
    env.update({"OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""})
    result = run(["demo"], env=env)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert ("embedded" in out) == (broker == "embedded")
    assert "offline" in out and "applied 1" in out
    assert (
        "total_summarizations" in out
        and "[Context from earlier in this session, summarized]" in out
    )
    assert "summarizer done: -" in out
    assert not children_of_demo(), "the demo left processes behind"


def test_replay_and_stats_against_a_running_api(stacks):
    stack = stacks.get("sqlite")
    path = next(p for p in TRANSCRIPTS if p.stem == "taubench-airline-task2")
    result = run(["replay", str(path), "--url", stack.url, "--session", "cli-replay"])
    assert result.returncode == 0, result.stdout + result.stderr
    posted = json.loads(path.read_text())["messages"]
    assert [m["id"] for m in stack.messages("cli-replay")] == [m["id"] for m in posted]
    stats = run(["stats", "--url", stack.url])
    assert stats.returncode == 0 and "total_summarizations" in stats.stdout


def test_replay_openai_format_file(stacks, tmp_path):
    stack = stacks.get("sqlite")
    f = tmp_path / "chat.json"
    f.write_text(
        json.dumps(
            [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "why is the queue backed up?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "queue_depth", "arguments": '{"q": "jobs"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "depth=18234"},
                {"role": "assistant", "content": "18,234 jobs are waiting."},
                {"role": "user", "content": "thanks"},
            ]
        )
    )
    result = run(
        ["replay", str(f), "--url", stack.url, "--session", "cli-openai", "--format", "openai"]
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert [m["type"] for m in stack.messages("cli-openai")] == [
        "system",
        "human",
        "ai",
        "tool",
        "ai",
        "human",
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ('{"no": "messages"}', '"messages"'),
        ('[{"content": "x"}]', "neither"),
        ('[{"type": "human", "content": 5}]', "message 0"),
        ("[]", "no messages"),
    ],
)
def test_replay_wrong_file_one_line_nonzero_exit(tmp_path, content, expected):
    f = tmp_path / "bad.json"
    if content is not None:
        f.write_text(content)
    result = run(["replay", str(f), "--url", "http://127.0.0.1:9"])
    assert result.returncode == 1
    err = result.stderr.strip()
    assert expected in err and len(err.splitlines()) == 1, err


def test_wrong_format_flag_and_bad_settings_fail_cleanly(tmp_path):
    f = tmp_path / "t.json"
    f.write_text('[{"type": "human", "content": "x"}]')
    result = run(["replay", str(f), "--format", "openai", "--url", "http://127.0.0.1:9"])
    assert result.returncode == 1 and "expected openai format" in result.stderr
    result = run(["stats"], env={"SUMMARIZATION_KEEP_CHARS": "90000"})
    assert result.returncode == 2 and "SUMMARIZATION_KEEP_CHARS" in result.stderr
    result = run(["stats", "--url", "http://127.0.0.1:9"])
    assert result.returncode == 1 and "cannot read /stats" in result.stderr


def test_demo_interrupted_with_ctrl_c_stops_everything_it_started():
    proc = subprocess.Popen(
        OFFPATH + ["demo"],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "120"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = []
    for line in proc.stdout:
        out.append(line)
        if "worker and API are up" in line:
            proc.send_signal(signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(out) + rest
    assert "interrupted" in rest
    assert not children_of_demo(), "the demo left processes behind after Ctrl-C"


def test_migrate_says_what_it_did_and_database_errors_are_one_line(tmp_path):
    env = {"DATA_DIR": str(tmp_path)}
    first = run(["migrate"], env=env)
    assert first.returncode == 0 and "created" in first.stdout, first.stdout + first.stderr
    again = run(["migrate"], env=env)
    assert again.returncode == 0 and "up to date" in again.stdout
    missing = run(
        ["migrate"], env={"DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/offpath_no_such_db"}
    )
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    wrong = run(["migrate"], env={"DATABASE_URL": "mysql://root@127.0.0.1/x"})
    assert wrong.returncode == 2 and "DATABASE_URL" in wrong.stderr


def test_flower_refuses_to_listen_beyond_localhost_without_a_password():
    r = run(["flower", "--address", "0.0.0.0"], env={"FLOWER_BASIC_AUTH": ""})
    assert r.returncode == 1 and "FLOWER_BASIC_AUTH" in r.stderr
    r = run(["flower"], env={"FLOWER_BASIC_AUTH": "nocolon"})
    assert r.returncode == 2 and "FLOWER_BASIC_AUTH" in r.stderr
