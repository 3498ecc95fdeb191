"""Fuzzed (issue 10): schemathesis runs every check (``--checks all``) against a real API
process, with an admin key, for a bounded time; no 5xx and no answer off the OpenAPI document.

``FUZZ_SECONDS`` (20) bounds the run, ``FUZZ_SEED`` (fixed, so CI is repeatable) picks the
examples: ``FUZZ_SECONDS=300 FUZZ_SEED=$RANDOM pytest tests/integration/test_fuzz.py`` fuzzes
longer. The run's events are in ``fuzz.ndjson`` under the test's tmp_path.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import jsonschema_rs
import pytest
from stack import BIN, Stack, chat_run_in_flight, wait_for

from offpath.api.app import create_app

pytestmark = pytest.mark.usefixtures("stub")

SECONDS = int(os.environ.get("FUZZ_SECONDS", "20"))
SEED = int(os.environ.get("FUZZ_SEED", "20261130"))

#: Checks whose every failure fails the test.
STRICT = {
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "missing_required_header",
    "unsupported_method",
    "allow_header_conformance",
    "ignored_auth",
    "use_after_free",
    "ensure_resource_availability",
    "object_level_authorization",
}


@dataclass
class Exchange:
    """One request schemathesis sent and the answer it got."""

    operation: str  # "POST /sessions/{session_id}/turns"
    status: int | None
    request: bytes
    response: bytes
    negative: set[str]  # the parts of the request generated to break the schema
    uri: str = ""  # the request's URL
    before: list[Exchange] = field(default_factory=list, repr=False)  # its scenario's earlier

    def answer(self) -> Any:
        try:
            return json.loads(self.response)
        except ValueError:
            return None

    def show(self) -> str:
        sent = self.request.decode("utf-8", "replace")[:300]
        got = self.response.decode("utf-8", "replace")[:300]
        return f"{self.operation} -> {self.status}\n    sent: {sent}\n    got: {got}"


@dataclass
class Failure:
    check: str
    title: str
    exchange: Exchange


def _bytes(content: Any) -> bytes:
    if isinstance(content, dict) and "$base64" in content:
        return base64.b64decode(content["$base64"])
    return b"" if content is None else str(content).encode()


def read_events(path: Path) -> tuple[list[Exchange], list[Failure], list[str]]:
    """The exchanges, check failures and engine errors of a schemathesis NDJSON report."""
    exchanges: list[Exchange] = []
    failures: list[Failure] = []
    errors: list[str] = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if "NonFatalError" in event or "FatalError" in event:
            error = event.get("NonFatalError") or event.get("FatalError")
            errors.append(json.dumps(error)[:500])
            continue
        finished = event.get("ScenarioFinished") or event.get("FuzzScenarioFinished")
        if not finished:
            continue
        recorder = finished["recorder"]
        by_case: dict[str, Exchange] = {}
        scenario: list[Exchange] = []
        for case_id, interaction in (recorder.get("interactions") or {}).items():
            case = (recorder.get("cases") or {}).get(case_id, {}).get("value", {})
            request, response = interaction["request"], interaction.get("response") or {}
            parts = (case.get("meta") or {}).get("components") or {}
            exchange = Exchange(
                operation=f"{request['method']} {case.get('path', request['uri'])}",
                status=response.get("status_code"),
                request=_bytes(request.get("body")),
                response=_bytes(response.get("content")),
                negative={k for k, v in parts.items() if v.get("mode") == "negative"},
                uri=request["uri"],
                before=list(scenario),
            )
            scenario.append(exchange)
            by_case[case_id] = exchange
            exchanges.append(exchange)
        for case_id, checks in (recorder.get("checks") or {}).items():
            for check in checks:
                if check["status"] == "failure" and case_id in by_case:
                    info = (check.get("failure_info") or {}).get("failure") or {}
                    failures.append(Failure(check["name"], info.get("title", ""), by_case[case_id]))
    return exchanges, failures, errors


def recreated_after_its_delete(exchange: Exchange) -> bool:
    """A ``use_after_free`` report that is not one: after the session's last successful
    DELETE in the scenario, a successful write to one of its routes (``POST .../turns`` or
    ``.../messages`` creates a session) made it again. Schemathesis counts only a write to
    the deleted URL itself as a re-creation."""
    session = urlsplit(exchange.uri).path.split("/")[2:3]
    if not session:
        return False

    def of_session(e: Exchange) -> bool:
        return urlsplit(e.uri).path.split("/")[2:3] == session and 200 <= (e.status or 0) < 300

    deletes = [
        i
        for i, e in enumerate(exchange.before)
        if of_session(e) and e.operation == ("DELETE /sessions/{session_id}")
    ]
    return bool(deletes) and any(
        of_session(e) and e.operation.startswith("POST ") for e in exchange.before[deletes[-1] :]
    )


def refused_for_a_reason_no_schema_says(exchange: Exchange) -> bool:
    """A schema-valid request refused by a check the document cannot express: a 413
    (MAX_REQUEST_BYTES), or a 422 from the route itself (``detail`` only: an id already in
    the thread, arguments that are not a JSON object, MAX_JSON_DEPTH...) or from the body's
    storability check (one ``value_error`` on the whole body: an integer beyond 64 bits, a
    NUL character) or the query's (a ``value_error`` naming the parameter: a NUL, issue 20,
    item 4). A 422 with pydantic's field errors on a schema-valid body is not one: the
    document and the models disagree."""
    if exchange.status == 413:
        return True
    answer = exchange.answer()
    if exchange.status != 422 or not isinstance(answer, dict):
        return False
    if not isinstance(answer.get("detail"), str):
        return False
    errors = answer.get("errors", [])
    return all(
        e.get("type") == "value_error"
        and (e.get("loc") == ["body"] or (len(e.get("loc", [])) == 2 and e["loc"][0] == "query"))
        for e in errors
    )


def valid_after_all(exchange: Exchange, document: dict[str, Any]) -> bool:
    """Whether a body schemathesis generated to break the schema is valid against the
    document all the same (a mutation of one branch of a ``oneOf`` that lands in another)."""
    if exchange.negative != {"body"}:
        return False
    method, path = exchange.operation.split(" ", 1)
    operation = document["paths"].get(path, {}).get(method.lower(), {})
    media = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if media is None:
        return False
    try:
        body = json.loads(exchange.request)
    except ValueError:
        return False
    schema = {**media["schema"], "components": document["components"]}
    return jsonschema_rs.validator_for(schema).is_valid(body)


@dataclass
class FuzzRun:
    """What one schemathesis run sent and got, and what of it is wrong."""

    exchanges: list[Exchange]
    problems: list[str]
    expected: Counter[str]
    seconds: float
    #: (operation, status) pairs the OpenAPI document declares, e.g. ("GET /readyz", 503)
    declared: frozenset[tuple[str, int]] = frozenset()

    @property
    def statuses(self) -> Counter[tuple[str, int | None]]:
        return Counter((e.operation, e.status) for e in self.exchanges)

    @property
    def server_errors(self) -> int:
        """Answers >= 500 that the document does not declare for their operation (a 503 from
        ``/readyz`` with no worker consuming, or past a bound with ``Retry-After``, is an
        answer the route declares, counted in :attr:`statuses`)."""
        return sum(server_error(e, self.declared) for e in self.exchanges)


def declared_answers(document: dict[str, Any]) -> frozenset[tuple[str, int]]:
    """The (``"METHOD /path"``, status) pairs an OpenAPI document declares."""
    return frozenset(
        (f"{method.upper()} {path}", int(status))
        for path, item in document.get("paths", {}).items()
        for method, operation in item.items()
        if isinstance(operation, dict)
        for status in operation.get("responses", {})
        if status.isdigit()
    )


def server_error(exchange: Exchange, declared: frozenset[tuple[str, int]]) -> bool:
    status = exchange.status or 0
    return status >= 500 and (exchange.operation, status) not in declared


def fuzz(
    url: str, key: str, seconds: int, seed: int, folder: Path, sessions: Sequence[str] = ()
) -> FuzzRun:
    """Run schemathesis (``--checks all``, with ``key``) against the API at ``url`` for
    ``seconds`` and judge what it found (see the test below); its NDJSON report and cache
    are written under ``folder``. ``sessions``: ids that half of the generated
    ``session_id`` path parameters take (sessions set up in a state worth fuzzing, whose
    own writers may create them again after a delete: not a use after free).
    Shared with ``bench/hostile.py`` (longer runs)."""
    document = httpx.get(f"{url}/openapi.json", headers={"Authorization": f"Bearer {key}"}).json()
    report = folder / "fuzz.ndjson"
    config = folder / "schemathesis.toml"
    lines = []
    if sessions:
        lines = [
            "[dictionaries.sessions]",
            f"values = {json.dumps(list(sessions))}",
            "[parameters]",
            '"path.session_id" = { dictionary = "sessions", probability = 0.5 }',
        ]
    config.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    run = subprocess.run(
        [
            str(BIN / "schemathesis"),
            "--config-file",
            str(config),
            "run",
            f"{url}/openapi.json",
            "--header",
            f"Authorization: Bearer {key}",
            "--checks",
            "all",
            "--continue-on-failure",
            "--max-time",
            str(seconds),
            "--max-examples",
            "25" if seconds <= 60 else str(10 * seconds),
            "--seed",
            str(seed),
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--generation-database",
            "none",
            "--no-color",
            "--report",
            "ndjson",
            "--report-ndjson-path",
            str(report),
        ],
        cwd=folder,  # schemathesis keeps a cache of crashes in the working directory
        env={**os.environ, "COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=seconds + 300,
    )
    took = time.monotonic() - started
    assert run.returncode in (0, 1) and report.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    exchanges, failures, errors = read_events(report)
    problems = [f"schemathesis error: {e}" for e in errors]
    declared = declared_answers(document)
    problems += [f"5xx: {e.show()}" for e in exchanges if server_error(e, declared)]
    expected: Counter[str] = Counter()
    for f in failures:
        if f.check == "not_a_server_error" and not server_error(f.exchange, declared):
            expected[f"{f.exchange.status}: declared by {f.exchange.operation}"] += 1
            continue
        if f.check in STRICT:
            if f.check == "negative_data_rejection" and valid_after_all(f.exchange, document):
                expected["negative_data_rejection: the body was valid after all"] += 1
                continue
            if f.check == "use_after_free" and recreated_after_its_delete(f.exchange):
                expected["use_after_free: the session was written again after its delete"] += 1
                continue
            if f.check == "use_after_free" and any(
                f"/sessions/{s}/" in f.exchange.uri + "/" for s in sessions
            ):
                # a session set up for the run is written by its own writers too (the chat
                # runs that hold it), which schemathesis does not see: it comes back
                expected["use_after_free: a session set up for the run, written again"] += 1
                continue
            problems.append(f"{f.check} ({f.title}): {f.exchange.show()}")
        elif f.check == "max_response_time":  # slowness, not a wrong answer: counted
            expected[f"slow: {f.exchange.operation} over schemathesis's 10 s"] += 1
        elif f.check == "positive_data_acceptance":
            if refused_for_a_reason_no_schema_says(f.exchange):
                answer = f.exchange.answer() or {}
                expected[f"{f.exchange.status}: {str(answer.get('detail'))[:60]}"] += 1
            else:
                problems.append(f"{f.check} ({f.title}): {f.exchange.show()}")
        else:
            problems.append(f"{f.check}, a check this test does not know: {f.exchange.show()}")
    return FuzzRun(exchanges, problems, expected, took, declared)


def test_schemathesis_finds_no_server_error_and_no_answer_off_the_document(stacks, tmp_path):
    """What is asserted, and why:

    * no answer is a 5xx (``not_a_server_error``, and every status counted);
    * every answer matches the document: status codes, content types, headers, bodies
      (``*_conformance``), 405s with their ``Allow`` (``unsupported_method``,
      ``allow_header_conformance``); the key is never ignored (``ignored_auth``,
      ``missing_required_header``);
    * a request that breaks the schema is refused (``negative_data_rejection``), unless the
      body schemathesis sent as invalid is valid against the document after all (checked
      again here with a JSON Schema validator);
    * ``positive_data_acceptance`` (a schema-valid request gets a 2xx) is held to what the
      document can say. The API keeps the checks no schema expresses (a message id already
      in the thread, tool-call arguments that are not a JSON object, an integer beyond 64
      bits, MAX_JSON_DEPTH, MAX_MESSAGE_CHARS); their 422s are expected and only counted
      (:func:`refused_for_a_reason_no_schema_says`). Any other rejection of a valid request
      fails the test: the document promises something the models refuse;
    * the fuzzer gets past validation: POST /turns and POST /messages answer 200 too.
    """
    stack = stacks.get("sqlite")
    run = fuzz(stack.url, stack.key, SECONDS, SEED, tmp_path)
    print(f"\nschemathesis: {len(run.exchanges)} requests in {run.seconds:.0f}s (seed {SEED})")
    for (operation, status), n in sorted(run.statuses.items(), key=str):
        print(f"  {n:5d}  {status}  {operation}")
    if run.expected:
        print("  valid requests refused by the API's own checks (expected):")
        for reason, n in run.expected.most_common(10):
            print(f"  {n:5d}  {reason}")
    assert not run.problems, "\n".join(run.problems[:20])
    for operation in ("POST /sessions/{session_id}/turns", "POST /sessions/{session_id}/messages"):
        assert run.statuses[(operation, 200)] > 0, (
            f"the fuzzer never got past validation: {operation}"
        )


def prepared_session(stack: Stack) -> tuple[str, str]:
    """A session whose thread is over its prepare point and under its threshold, with its
    compaction prepared ahead by the worker: ``(session id, job id)``."""
    session = f"held-{uuid.uuid4().hex[:8]}"
    settings = stack.settings()
    target = (1 + settings.summarization_prepare_at) / 2 * settings.summarization_threshold_chars
    chars, i = 0, 0
    while chars < target:
        lines = "\n".join(
            f"10:{j % 60:02d} checkout-api p99={400 + j}ms req={i}" for j in range(100)
        )
        turn = [
            {"type": "human", "id": f"h{i}", "content": f"question {i}: why is checkout slow?"},
            {
                "type": "ai",
                "id": f"a{i}",
                "content": "",
                "tool_calls": [{"id": f"c{i}", "name": "get_logs", "args": {"turn": i}}],
            },
            {"type": "tool", "id": f"t{i}", "tool_call_id": f"c{i}", "content": lines},
        ]
        r = stack.post_turn(session, turn)
        assert r.status_code == 200, r.text
        chars, i = r.json()["chars"], i + 1
    (job,) = wait_for(
        lambda: [j for j in stack.jobs(session) if j["status"] == "prepared"], timeout=60
    )
    return session, job["job_id"]


def test_a_chat_run_on_a_prepared_session_gets_409_on_every_write_route(stacks, stub, backend):
    """Issue 34, item 2: ``POST /sessions/{id}/compact`` answered 500 while a chat run held
    the thread and a compaction was prepared (the compaction's apply met ``RunInProgress``;
    6 of 6 trials per backend). Every route that takes the thread answers 409 then, as its
    document declares, and the prepared compaction waits."""
    stack = stacks.get(backend)
    session, job_id = prepared_session(stack)
    document = stack.http.get("/openapi.json").json()
    with chat_run_in_flight(stack, stub, session):
        answers = {
            ("post", "/sessions/{session_id}/compact"): stack.http.post(
                f"/sessions/{session}/compact"
            ),
            ("delete", "/sessions/{session_id}"): stack.http.delete(f"/sessions/{session}"),
            ("post", "/sessions/{session_id}/turns"): stack.post_turn(
                session, [{"type": "human", "content": "one more"}]
            ),
            ("post", "/sessions/{session_id}/messages"): stack.http.post(
                f"/sessions/{session}/messages", json={"content": "one more"}
            ),
        }
    for (method, path), r in answers.items():
        assert r.status_code == 409, (method, path, r.status_code, r.text)
        assert "409" in document["paths"][path][method]["responses"], (method, path)
    assert (
        "a chat run holds the session"
        in answers[("post", "/sessions/{session_id}/compact")].json()["detail"]
    )
    (job,) = [j for j in stack.jobs(session) if j["job_id"] == job_id]
    assert job["status"] == "prepared", job


def test_schemathesis_with_a_chat_run_on_a_prepared_session(stacks, stub, tmp_path):
    """Issue 34, item 2: the state in which the fuzzer found the 500 (82 times): a prepared
    compaction and a chat run in flight on one session, which half of the generated session
    ids name. On PostgreSQL (the test above fuzzes SQLite), with a real admin key: no 5xx,
    nothing off the document."""
    stack = stacks.get("postgres")
    session, _ = prepared_session(stack)
    with chat_run_in_flight(stack, stub, session):
        run = fuzz(stack.url, stack.key, SECONDS, SEED, tmp_path, sessions=[session])
    held = [e for e in run.exchanges if f"/sessions/{session}" in e.uri]
    print(f"\nschemathesis: {len(run.exchanges)} requests, {len(held)} on the held session")
    for (operation, status), n in sorted(run.statuses.items(), key=str):
        print(f"  {n:5d}  {status}  {operation}")
    assert not run.problems, "\n".join(run.problems[:20])
    assert len(held) >= 10, "the fuzzer hardly reached the held session"


def test_an_answer_over_500_counts_as_a_server_error_unless_its_route_declares_it():
    document = create_app().openapi()
    declared = declared_answers(document)

    def answer(operation: str, status: int) -> Exchange:
        return Exchange(operation, status, b"", b"", set())

    # /readyz declares 503 (no worker consumes): an API run without workers answers it
    assert not server_error(answer("GET /readyz", 503), declared)
    assert server_error(answer("GET /readyz", 500), declared)
    assert server_error(answer("POST /sessions/{session_id}/turns", 502), declared)
    assert not server_error(answer("GET /stats", 200), declared)
