"""Safe to expose (issue 10): API keys and tenants, every byte counted, bounded storage,
host checks; on a real API process."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
import uuid

import httpx
import psycopg
import pytest
from stack import ROOT, free_port, wait_for

from offpath.config import load_settings

pytestmark = pytest.mark.usefixtures("stub")

LIMITS = {
    "MAX_REQUEST_BYTES": "300000",
    "MAX_MESSAGE_CHARS": "50000",
    "MAX_STATE_CHARS": "20000",
    "CHECKPOINT_HISTORY": "3",
}


def turn(text: str = "hello", **extra) -> dict:
    return {"messages": [{"type": "human", "content": text, **extra}]}


@pytest.fixture
def stack(stacks, backend):
    return stacks.get(backend, **LIMITS)


def anonymous(stack) -> httpx.Client:
    return httpx.Client(base_url=stack.url, timeout=30)


def as_key(stack, key: str) -> httpx.Client:
    return httpx.Client(base_url=stack.url, timeout=30, headers={"Authorization": f"Bearer {key}"})


# --- API keys and tenants ------------------------------------------------------------------


def test_every_route_but_the_probes_needs_a_key_and_the_openapi_document_says_so(stack):
    spec = stack.http.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    with anonymous(stack) as client:
        assert client.get("/healthz").status_code in (200, 503)
        assert client.get("/readyz").status_code in (200, 503)
        for path in ("/openapi.json", "/docs"):
            assert client.get(path).status_code == 401
        for path, methods in spec["paths"].items():
            url = path.replace("{session_id}", "s1")
            for method in methods:
                if path in ("/healthz", "/readyz"):
                    continue
                r = client.request(method.upper(), url, json=turn())
                assert r.status_code == 401, (method, path, r.status_code)
                assert r.headers.get("www-authenticate") == "Bearer"
                assert "offpath keys create" in r.json()["detail"]
        r = client.get("/stats", headers={"Authorization": "Bearer op_not-a-key"})
        assert r.status_code == 401 and "unknown or revoked" in r.json()["detail"]
        # a key sent in another scheme is not read, and the answer says so (it said only
        # "missing API key" though a credential was sent)
        for verb in ("GET", "POST"):
            r = client.request(
                verb,
                "/sessions/s1/turns" if verb == "POST" else "/stats",
                headers={"Authorization": "Basic b3A6eA=="},
                json=turn(),
            )
            detail = r.json()["detail"]
            assert r.status_code == 401 and "Authorization: Basic is not read" in detail, detail


def test_a_session_belongs_to_its_tenant_others_get_404_and_stats_are_per_tenant(stack):
    alice, bob = stack.create_key("alice"), stack.create_key("bob")
    session = f"tenant-{uuid.uuid4().hex[:8]}"
    with as_key(stack, alice) as a, as_key(stack, bob) as b:
        assert a.post(f"/sessions/{session}/turns", json=turn("alice's secret")).status_code == 200
        for path in ("messages", "compactions"):
            assert b.get(f"/sessions/{session}/{path}").status_code == 404
        r = b.post(f"/sessions/{session}/turns", json=turn("bob writes"))
        assert r.status_code == 404 and "no session" in r.json()["detail"]
        assert [
            m["content"] for m in a.get(f"/sessions/{session}/messages").json()["messages"]
        ] == ["alice's secret"]
        # the admin key sees every tenant's sessions
        assert stack.http.get(f"/sessions/{session}/messages").status_code == 200
        for client in (a, b):
            assert client.get("/stats").status_code == 200


def test_revoking_by_less_than_a_keys_prefix_says_what_a_prefix_is(tmp_path):
    # 'op_' (every key starts so) was answered 'no active key op_...', as if it were one
    from offpath.stores.db.engine import make_engine, migrate
    from offpath.stores.tenants import PREFIX_CHARS, UnknownKey, create_key, revoke_key

    settings = load_settings(data_dir=str(tmp_path))
    migrate(settings)
    engine = make_engine(settings)
    key = create_key(engine, "dave")
    with pytest.raises(UnknownKey, match=f"first {PREFIX_CHARS} chars as `keys list`"):
        revoke_key(engine, key[:3])
    assert revoke_key(engine, key[:PREFIX_CHARS]) == 1
    engine.dispose()


def test_a_revoked_key_stops_working(stack):
    key = stack.create_key("carol")
    with as_key(stack, key) as c:
        assert c.get("/stats").status_code == 200
        prefix = key[:10]
        result = subprocess.run(
            [sys.executable, "-m", "offpath.cli.main", "keys", "revoke", prefix],
            cwd=ROOT,
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        wait_for(lambda: c.get("/stats").status_code == 401, timeout=15, interval=0.5)
        listed = subprocess.run(
            [sys.executable, "-m", "offpath.cli.main", "keys", "list"],
            cwd=ROOT,
            env={**stack.env, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert prefix in listed.stdout and key not in listed.stdout


# --- every byte counted --------------------------------------------------------------------


BIG = "x" * 60_000  # over MAX_MESSAGE_CHARS (50,000) whatever field it is in
OVERSIZED_FIELDS = {
    "media block": {
        "type": "human",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + BIG}},
        ],
    },
    "additional_kwargs": {"type": "human", "content": "hi", "additional_kwargs": {"x": BIG}},
    "id": {"type": "human", "content": "hi", "id": "i" + BIG},
    "name": {"type": "human", "content": "hi", "name": BIG},
    "tool artifact": {
        "type": "tool",
        "content": "ok",
        "tool_call_id": "c",
        "artifact": BIG,
    },
}


@pytest.mark.parametrize("field", OVERSIZED_FIELDS, ids=str)
def test_every_field_of_a_message_counts_against_the_limit(stack, field):
    session = f"bytes-{uuid.uuid4().hex[:8]}"
    r = stack.post_turn(session, [OVERSIZED_FIELDS[field]])
    assert r.status_code == 422, r.text[:300]
    assert "MAX_MESSAGE_CHARS" in r.json()["detail"]
    assert stack.http.get(f"/sessions/{session}/messages").status_code == 404


def test_request_body_state_and_chat_limits(stack):
    session = f"limits-{uuid.uuid4().hex[:8]}"
    r = stack.post_turn(session, [{"type": "human", "content": "y" * 400_000}])
    assert r.status_code == 413 and "MAX_REQUEST_BYTES" in r.json()["detail"]

    def chunks():  # no Content-Length: counted as it streams in
        yield b'{"messages": [{"type": "human", "content": "'
        for _ in range(40):
            yield b"z" * 10_000
        yield b'"}]}'

    r = stack.http.post(
        f"/sessions/{session}/turns", content=chunks(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413
    r = stack.post_turn(
        session, [{"type": "human", "content": "hi"}], state={"notes": "n" * 30_000}
    )
    assert r.status_code == 422 and "MAX_STATE_CHARS" in r.json()["detail"]
    r = stack.http.post(f"/sessions/{session}/messages", json={"content": "q" * 60_000})
    assert r.status_code == 422 and "MAX_MESSAGE_CHARS" in r.json()["detail"]
    assert stack.http.get(f"/sessions/{session}/messages").status_code == 404


@pytest.mark.parametrize("depth", [40, 600, 5_000])
def test_deep_nesting_answers_422_never_500(stack, depth):
    session = f"deep-{uuid.uuid4().hex[:8]}"
    nested = "[" * depth + "]" * depth
    bodies = [
        '{"messages": [{"type": "human", "content": "x"}], "state": {"a": NESTED}}',
        '{"messages": [{"type": "ai", "content": "", "tool_calls": '
        '[{"id": "c", "name": "f", "args": {"a": NESTED}}]}]}',
    ]
    bodies = [b.replace("NESTED", nested) for b in bodies]
    for body in bodies:
        r = stack.http.post(
            f"/sessions/{session}/turns",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 422, (depth, r.status_code, r.text[:200])
        assert "MAX_JSON_DEPTH" in r.json()["detail"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"messages": [{"type": "human", "content": "x"}], "state": {"\\ud800": 1}}', "state key"),
        ('{"messages": [{"type": "human", "content": "a\\udc00b"}]}', "messages[0].content"),
        ('{"content": "hello \\ud83d"}', "content"),
    ],
)
def test_a_lone_surrogate_is_refused_naming_the_field(stack, body, field):
    session = f"surrogate-{uuid.uuid4().hex[:8]}"
    route = "messages" if body.startswith('{"content"') else "turns"
    r = stack.http.post(
        f"/sessions/{session}/{route}", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"] and "surrogate" in r.json()["detail"]
    assert stack.http.get(f"/sessions/{session}/messages").status_code == 404


def test_a_422_never_echoes_the_input(stack):
    r = stack.http.post("/sessions/echo/turns", json={"messages": "m" * 250_000})
    assert r.status_code == 422
    assert len(r.content) < 3_000 and "mmmmmmmmmm" not in r.text
    body = r.json()
    assert isinstance(body["detail"], str) and isinstance(body["errors"], list)


def test_an_unknown_host_header_is_refused(stack):
    r = stack.http.get("/healthz", headers={"Host": "evil.example"})
    assert r.status_code == 400


# --- storage stays bounded -----------------------------------------------------------------


def checkpoint_rows(stack, session: str) -> int:
    if stack.pg_url:
        with psycopg.connect(stack.pg_url) as conn:
            return conn.execute(
                "SELECT count(*) FROM checkpoints WHERE thread_id = %s", (session,)
            ).fetchone()[0]
    with sqlite3.connect(f"{stack.env['DATA_DIR']}/checkpoints.db") as conn:
        return conn.execute(
            "SELECT count(*) FROM checkpoints WHERE thread_id = ?", (session,)
        ).fetchone()[0]


def test_checkpoint_history_is_pruned_per_thread(stack):
    session = f"prune-{uuid.uuid4().hex[:8]}"
    for i in range(12):
        r = stack.post_turn(session, turn(f"turn {i} " + "log line\n" * 200)["messages"])
        assert r.status_code == 200
    wait_for(lambda: checkpoint_rows(stack, session) <= 3, timeout=10)
    assert len(stack.messages(session)) == 12  # the thread is whole: only history went


def test_auth_disabled_beyond_localhost_is_warned_about(tmp_path):
    env = {
        "DATA_DIR": str(tmp_path),
        "AUTH_DISABLED": "true",
        "REDIS_URL": "redis://127.0.0.1:6379/13",
        "SUMMARIZATION_ENABLED": "false",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "offpath.cli.main",
            "api",
            "--host",
            "0.0.0.0",
            "--port",
            str(free_port()),
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "AUTH_DISABLED" in line or time.monotonic() > deadline:
                break
        assert any("AUTH_DISABLED=true and the API listens on 0.0.0.0" in x for x in lines), lines
    finally:
        proc.terminate()
        proc.wait(timeout=30)
