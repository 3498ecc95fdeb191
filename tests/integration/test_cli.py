"""The command line as a user runs it (issue 4): the demo on embedded defaults, replay
against a running API, stats, and one clear line for wrong files."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
from shared import TRANSCRIPTS
from stack import REDIS_URL, ROOT, forget_broker_queue, free_port, wait_for

pytestmark = pytest.mark.usefixtures("stub")

OFFPATH = [sys.executable, "-m", "offpath.cli.main"]


def run(args, env=None, timeout=180):
    return subprocess.run(
        OFFPATH + args,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "120", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: Set in the environment of every demo these tests start (its worker and API inherit it):
#: a demo someone else runs on the machine is not one of theirs.
DEMO_MARK = {"OFFPATH_TEST_DEMO": uuid.uuid4().hex}


def children_of_demo():
    """The live processes a demo of these tests started (its worker and API)."""
    mark = DEMO_MARK["OFFPATH_TEST_DEMO"]
    return [
        p
        for p in psutil.process_iter(["cmdline", "environ"])  # None where access is denied
        if any("demo-" in a for a in (p.info["cmdline"] or []))
        and (p.info["environ"] or {}).get("OFFPATH_TEST_DEMO") == mark
    ]


def closing_figures(text: str) -> str:
    """The demo's closing "saved: ..." paragraph in ``text``, its whitespace made single
    spaces (the demo wraps it at the terminal's width)."""
    found = re.search(r"^saved: .*?`recall` reads them\)", text, re.S | re.M)
    assert found, text
    return " ".join(found.group(0).split())


@pytest.mark.parametrize("broker", ["redis", "embedded"])
def test_demo_runs_to_the_end_and_leaves_no_process(broker):
    # the redis demo runs in the tests' database (13), where the session checks that it
    # leaves no kombu binding behind (conftest.py)
    closed = f"redis://127.0.0.1:{free_port()}/0"
    env = {"REDIS_URL": closed if broker == "embedded" else REDIS_URL}
    env.update({"OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""})
    result = run(["demo"], env={**env, **DEMO_MARK})
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert ("embedded" in out) == (broker == "embedded")
    assert "offline" in out and "[scripted model]" in out
    assert re.search(r"applied [1-9]", out), out
    if broker == "redis":  # the middleware applied a summary inside a run
        assert "compacted during the run" in out, out
    assert (
        "total_summarizations" in out
        and "[Context from earlier in this session, summarized]" in out
    )
    assert "] summarizer: " in out  # the worker's log lines
    # issue 35, item 6: the closing summary's quoted request is not called the turn in
    # progress (it named turn 5 so while the frontier said turn 6 was under way)
    assert "Request of the turn in progress" not in out
    # issue 21, item 10: the same figures at every run, the ones the README states
    assert closing_figures(out) == closing_figures((ROOT / "README.md").read_text()), out
    # it prints the web UI's dashboard URL (issue 12), then ends pointing at what to do next
    # (issue 35, item 6): using it in one's own agent, and running it for real
    lines = out.strip().splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("dashboard: ")]
    assert re.fullmatch(r"dashboard: http://127\.0\.0\.1:\d+/ui", lines[at]), out
    after = " ".join(lines[at + 1 :])
    assert after.startswith("next: use it in your own agent") and "OffPathCompaction" in after
    assert "run it for real" in after and "offpath migrate, worker" in after, after
    assert all(len(line) <= 80 for line in lines[at + 1 :]), lines[at + 1 :]
    assert not children_of_demo(), "the demo left processes behind"


def test_demo_serve_keeps_the_dashboard_up_until_interrupted():
    """`offpath demo --serve`: after its report the API (and /ui) stays up; Ctrl-C (SIGINT)
    stops everything it started and exits 0."""
    import httpx

    env = {**os.environ, "COLUMNS": "200", "REDIS_URL": REDIS_URL, **DEMO_MARK}
    env.update({"OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""})
    port = free_port()  # issue 35, item 6: the API's port may be chosen
    proc = subprocess.Popen(
        OFFPATH + ["demo", "--serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    try:
        lines = []
        for line in proc.stdout:  # the report, then the dashboard's line
            lines.append(line)
            if line.startswith("dashboard: "):
                break
        found = re.match(rf"dashboard: (http://127\.0\.0\.1:{port}/ui)", lines[-1])
        assert found, "".join(lines)
        time.sleep(2)  # still up after the report
        page = httpx.get(found.group(1), timeout=10)  # AUTH_DISABLED: no login
        assert page.status_code == 200 and 'data-stat="summary.jobs.applied"' in page.text
        assert children_of_demo()
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()
        assert proc.wait(timeout=60) == 0, rest
        assert "stopping the worker and the API" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_for(lambda: not children_of_demo(), timeout=20)


def test_replay_and_stats_against_a_running_api(stacks):
    stack = stacks.get("sqlite")
    path = next(p for p in TRANSCRIPTS if p.stem == "taubench-airline-task2")
    result = run(
        ["replay", str(path), "--url", stack.url, "--session", "cli-replay"],
        env={"OFFPATH_API_KEY": stack.key},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    posted = json.loads(path.read_text())["messages"]
    assert [m["id"] for m in stack.messages("cli-replay")] == [m["id"] for m in posted]
    stats = run(["stats", "--url", stack.url, "--api-key", stack.key])
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
        ["replay", str(f), "--url", stack.url, "--session", "cli-openai", "--format", "openai"],
        env={"OFFPATH_API_KEY": stack.key},
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
    # a setting of the service that a client does not read cannot stop it (issue 21, item
    # 12: `offpath stats` exited 2 on this one); a command that starts a part of the service
    # still refuses it, and a client still refuses a bad setting of its own
    server_only = {"SUMMARIZATION_KEEP_CHARS": "90000"}
    for args in (["stats"], ["sessions"], ["show", "s"], ["compact", "s"], ["replay", str(f)]):
        result = run([*args, "--url", "http://127.0.0.1:9"], env=server_only)
        assert result.returncode == 1 and "cannot" in result.stderr, (args, result.stderr)
    result = run(["migrate"], env=server_only)
    assert result.returncode == 2 and "SUMMARIZATION_KEEP_CHARS" in result.stderr
    result = run(["stats"], env={"API_URL": "ftp://127.0.0.1:9"})
    err = result.stderr.strip()
    assert result.returncode == 2 and "API_URL" in err and len(err.splitlines()) == 1, err
    result = run(["stats", "--url", "http://127.0.0.1:9"])
    assert result.returncode == 1 and "cannot read /stats" in result.stderr


def test_help_text_is_wrapped_by_the_terminal_not_by_the_docstrings():
    """Issue 21, item 12: help wrapped raggedly ("...the summary marked), then its" then
    "compaction jobs." on a line of its own, at any width): the docstrings' line breaks
    were kept. Now a paragraph is one line wherever the terminal is wide enough, and every
    line of a long one but its last is filled."""
    import inspect

    import typer.main

    from offpath.cli.main import app

    group = typer.main.get_command(app)
    listing = run(["--help"], env={"COLUMNS": "200"}).stdout
    for name, command in group.commands.items():
        first = " ".join(inspect.cleandoc(command.help or "").split("\n\n")[0].split())
        assert any(first in line for line in listing.splitlines()), (name, first)
    worker = run(["worker", "--help"], env={"COLUMNS": "100"}).stdout
    paragraph = inspect.cleandoc(group.commands["worker"].help).split("\n\n")[1]
    paragraph = " ".join(paragraph.replace("``", "").split())  # ``code`` is shown as code
    lines = [line.strip() for line in worker.splitlines()]
    start = next(i for i, line in enumerate(lines) if paragraph.startswith(line) and line)
    end = next(i for i in range(start, len(lines)) if not lines[i])
    assert " ".join(lines[start:end]) == paragraph
    assert all(len(line) > 80 for line in lines[start : end - 1]), lines[start:end]


def sigint_as_in_a_terminal() -> None:
    """A terminal's foreground command gets SIGINT's default action; the suite may itself run
    in a background job of a non-interactive shell, whose children inherit SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_demo_interrupted_with_ctrl_c_stops_everything_it_started():
    proc = subprocess.Popen(
        OFFPATH + ["demo"],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "120", **DEMO_MARK},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=sigint_as_in_a_terminal,
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


def start_worker_as_in_a_terminal(tmp_path):
    """``offpath worker`` as a shell starts it: the leader of the terminal's foreground
    process group (os.killpg on it is the terminal's Ctrl-C), on a private queue in the
    tests' Redis database, SQLite under tmp_path. Returns (process, log, env, name)."""
    name = uuid.uuid4().hex[:8]
    env = {
        **os.environ,
        "DATA_DIR": str(tmp_path / "data"),
        "DATABASE_URL": "",
        "REDIS_URL": REDIS_URL,
        "CELERY_QUEUE": f"test-{name}",
        "REDIS_KEY_PREFIX": f"test-{name}",
        "WORKER_POOL": "threads",
        "WORKER_CONCURRENCY": "4",
        "LOG_LEVEL": "INFO",
    }
    log = tmp_path / f"worker-{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            OFFPATH + ["worker", "--name", f"w-{name}-0@%h"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def ready():
        assert proc.poll() is None, log.read_text()
        return "ready." in log.read_text()

    wait_for(ready, timeout=60, interval=0.1)
    return proc, log, env, name


@pytest.mark.parametrize("trial", range(3))
def test_worker_ctrl_c_is_one_warm_shutdown(tmp_path, trial):
    """Issue 8, item 16: the terminal sends SIGINT to the whole foreground group; the
    Celery child must see one stop request, not two (a second one is a cold shutdown)."""
    proc, log, env, name = start_worker_as_in_a_terminal(tmp_path)
    children = psutil.Process(proc.pid).children(recursive=True)
    try:
        assert children, "offpath worker started no Celery child"
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
        text = log.read_text()
        assert code == 0, text
        assert "worker: Warm shutdown" in text, text
        assert "Cold shutdown" not in text and "Unrecoverable error" not in text, text
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"Celery processes left running: {alive}"
    finally:
        kill_all(proc, children)
        forget_broker_queue(env, worker_names=[f"w-{name}-"])


def test_worker_killed_supervisor_leaves_no_orphan(tmp_path):
    """SIGKILL of ``offpath worker`` (it cannot pass anything on) still stops its child."""
    proc, log, env, name = start_worker_as_in_a_terminal(tmp_path)
    children = psutil.Process(proc.pid).children(recursive=True)
    try:
        assert children, "offpath worker started no Celery child"
        proc.kill()  # the supervisor only
        proc.wait(timeout=10)
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"Celery processes orphaned: {alive}\n{log.read_text()}"
        assert "worker: Warm shutdown" in log.read_text()
    finally:
        kill_all(proc, children)
        forget_broker_queue(env, worker_names=[f"w-{name}-"])


def kill_all(proc, children):
    for p in children:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if proc.poll() is None:
        proc.kill()
        proc.wait()


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
    # the driver's message has two lines: where it failed (kept, issue 15), then a hint
    closed = run(["migrate"], env={"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"})
    assert closed.returncode == 1, closed.stdout + closed.stderr
    assert len(closed.stderr.strip().splitlines()) == 1, closed.stderr
    assert '"127.0.0.1", port 1 failed: Connection refused' in closed.stderr, closed.stderr
    assert "Is the server running" in closed.stderr, closed.stderr
    wrong = run(["migrate"], env={"DATABASE_URL": "mysql://root@127.0.0.1/x"})
    assert wrong.returncode == 2 and "DATABASE_URL" in wrong.stderr


def test_api_on_a_port_in_use_says_so_in_one_line_before_starting(tmp_path):
    """``offpath api`` on a port another process listens on: one line naming the port, exit
    1, before the migration and the start-up (uvicorn said it after both, exit 3)."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        r = run(["api", "--port", str(port)], env={"DATA_DIR": str(tmp_path)}, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"127.0.0.1:{port}" in r.stderr and "--port" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not list(tmp_path.iterdir()), "it migrated a database before refusing"


def test_flower_refuses_to_listen_beyond_localhost_without_a_password():
    r = run(["flower", "--address", "0.0.0.0"], env={"FLOWER_BASIC_AUTH": ""})
    assert r.returncode == 1 and "FLOWER_BASIC_AUTH" in r.stderr
    r = run(["flower"], env={"FLOWER_BASIC_AUTH": "nocolon"})
    assert r.returncode == 2 and "FLOWER_BASIC_AUTH" in r.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["worker", "--pool", "bogus"], "--pool"),
        (["worker", "--concurrency", "0"], "--concurrency"),
        (["worker", "--concurrency", "-3"], "--concurrency"),
        (["worker", "--processes", "-1"], "--processes"),
        (["worker", "--name", "bad name@@"], "--name"),
        (["api", "--port", "70000"], "--port"),
        (["flower", "--port", "99999"], "--port"),
        (["flower", "--port", "-1"], "--port"),
        (["api"], "REDIS_URL"),
        (["beat", "--check"], "REDIS_URL"),
        (["api", "--host", "127.0.0.1"], "AGENT_TOOLS"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_an_option_or_setting_out_of_its_range_is_one_line_and_exit_2(tmp_path, args, named):
    # an option that sets what a setting sets is checked as the setting is (the worker took
    # --pool bogus and restarted Celery's usage error forever, --processes -1 exited 0 in
    # silence, a port over 65535 was a traceback or a bind to port - 65536); a Redis URL with
    # a port out of range or a database that is no number passed the settings check
    env = {"DATA_DIR": str(tmp_path), "WORKER_POOL": "threads"}
    if args[-1] in ("api", "--check"):
        env["REDIS_URL"] = "redis://127.0.0.1:99999/0" if args == ["api"] else "redis://h:6379/x"
    if "--host" in args:  # a module that holds no list of tools
        env["AGENT_TOOLS"] = "os:path"
    r = run(args, env=env, timeout=60)
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], err[-2_000:])
    assert named in err and "Traceback" not in err, err
    assert not list(tmp_path.iterdir()), "it migrated a database before refusing"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["show", "s", "--width", "-5"], "--width"),
        (["compact", "s", "--timeout", "-1"], "--timeout"),
        (["demo", "--timeout", "0"], "--timeout"),
        (["revert", "s", ""], "give a job id"),
        (["replay", "f.json", "--format", "xml"], "--format must be one of"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_a_usage_error_is_one_line_and_exit_2_before_the_api_is_asked(args, said):
    # each was taken (a negative width showed all, a negative timeout queued the job then
    # 'did not end within -1s'), said oddly ("'' starts 3 job ids") or exited 1
    r = run([*args, "--url", "http://127.0.0.1:9"] if args[0] != "demo" else args, timeout=60)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr


@contextlib.contextmanager
def other_server(answer):
    """A server on 127.0.0.1 that is not offpath's API: each GET is answered ``answer(path)``,
    ``(status, content type, body)``. Yields its base URL."""

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, kind, body = answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_a_url_that_is_not_the_apis_is_said_so_without_its_page():
    # Flower's URL given to --url: its HTML went into the error line whole; a URL with /stats
    # after it said only "404: Not Found"
    page = b"<html><body>" + b"dashboard " * 100 + b"</body></html>"
    with other_server(lambda path: (200 if path == "/stats" else 404, "text/html", page)) as base:
        for args in (["stats"], ["sessions"], ["show", "s"]):
            r = run([*args, "--url", base], timeout=60)
            err = r.stderr.strip()
            assert r.returncode == 1 and "give --url the API's base URL" in err, (args, err)
            assert "<html" not in err and len(err.splitlines()) == 1, err


def test_a_server_error_is_said_by_its_status_not_blamed_on_the_url():
    # a 500 text/plain (an unhandled error) or a proxy's 502 before a working API was said
    # as "give --url the API's base URL"
    def broken(path):
        return 502 if "stats" in path else 500, "text/plain", b"Internal Server Error"

    with other_server(broken) as base:
        for args, status in ((["stats"], "502"), (["show", "s"], "500")):
            r = run([*args, "--url", base], timeout=60)
            err = r.stderr.strip()
            assert r.returncode == 1 and f"answered {status} (text/plain)" in err, err
            assert "--url" not in err, err


def test_a_session_id_made_from_a_file_name_is_one_the_api_takes():
    from offpath.cli.common import session_name

    for name, made in [
        ("my incident.json", "my-incident"),
        ("inc_7.v2.json", "inc_7.v2"),
        ("..json", "session"),
    ]:
        assert session_name(Path(name)) == made, name
    # names of other scripts: ids the API takes, two names two ids
    made = {session_name(Path(name)) for name in ("事故.json", "障害.json", "事故-2026.json")}
    assert len(made) == 3 and all(re.fullmatch(r"[A-Za-z0-9._-]{1,128}", m) for m in made), made


def test_demo_with_a_file_it_cannot_read_says_so_before_anything_starts(tmp_path):
    # it started the worker and the API and removed the last demo's data first
    r = run(["demo", "--file", str(tmp_path / "nonexistent.json")], timeout=60)
    err = r.stderr.strip()
    assert r.returncode == 1 and "no such file" in err and len(err.splitlines()) == 1, err
    assert "broker" not in r.stdout and "worker and API are up" not in r.stdout, r.stdout


def test_flower_on_a_port_in_use_says_so_in_one_line():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        r = run(["flower", "--port", str(port)], timeout=60)
    err = r.stderr.strip()
    assert r.returncode == 1 and f"127.0.0.1:{port}" in err and "--port" in err, err
    assert "Traceback" not in err, err


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=lambda p: p.stem)
def test_replay_is_a_lossless_round_trip(stacks, tmp_path, path):
    """Issue 8, item 18: `offpath replay` keeps what langchain_core's converter keeps:
    invalid tool calls, response and usage metadata, a tool message's status and artifact."""
    from langchain_core.messages import (
        AIMessage,
        ToolMessage,
        messages_from_dict,
        messages_to_dict,
    )
    from shared import load, messages_of

    stack = stacks.get("sqlite", llm=False, SUMMARIZATION_ENABLED="false")
    rich = []
    for i, m in enumerate(messages_of(load(path))):
        if isinstance(m, AIMessage):
            m = m.model_copy(
                update={
                    "response_metadata": {"model_name": "m-1", "finish_reason": "stop"},
                    "usage_metadata": {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12},
                }
            )
            if m.tool_calls and not any(x.type == "ai" and x.invalid_tool_calls for x in rich):
                bad = {"id": f"bad-{i}", "name": "f", "args": "{oops", "error": "not JSON"}
                m = m.model_copy(
                    update={"invalid_tool_calls": [{**bad, "type": "invalid_tool_call"}]}
                )
                rich.append(m)
                rich.append(
                    ToolMessage(
                        id=f"bad-result-{i}",
                        content="error: arguments are not JSON",
                        tool_call_id=f"bad-{i}",
                        status="error",
                    )
                )
                continue
        elif isinstance(m, ToolMessage):
            m = m.model_copy(update={"artifact": {"rows": i}, "status": "success"})
        rich.append(m)
    f = tmp_path / f"{path.stem}.json"
    f.write_text(json.dumps({"messages": messages_to_dict(rich)}))
    session = f"lossless-{path.stem}"[:60]
    result = run(
        ["replay", str(f), "--url", stack.url, "--session", session],
        env={"OFFPATH_API_KEY": stack.key},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    r = stack.http.get(f"/sessions/{session}/messages", params={"format": "langchain"})
    assert messages_from_dict(r.json()["messages"]) == rich
