"""The demo agent (issue 9, item 2): ``create_agent`` over the read-only SRE tools and the
scripted chat model, and the fixture files they serve.

Runs in-process with an in-memory checkpointer: no Redis, no database, no LLM.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from offpath.agent import scripted
from offpath.agent.scripted import DEMO_REQUESTS, LABEL, ScriptedChatModel, locate, plan_for
from offpath.agent.sre_tools import SRE_TOOLS
from offpath.agent.sre_tools.cluster import pod_status, recent_deploys
from offpath.agent.sre_tools.fixtures import MAX_CHARS
from offpath.agent.sre_tools.logs import get_logs
from offpath.agent.sre_tools.metrics import query_metrics
from offpath.compaction.accounting import total_chars
from offpath.compaction.summary import build_summary_message

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "examples" / "sre"
GENERATOR = ROOT / "examples" / "make_sre_fixtures.py"


@pytest.fixture(autouse=True)
def _committed_fixtures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEMO_FIXTURES_DIR", raising=False)


def _agent(model: ScriptedChatModel | None = None) -> Any:
    return create_agent(model or ScriptedChatModel(), SRE_TOOLS, checkpointer=InMemorySaver())


def _run(agent: Any, thread: str, request: str) -> list[BaseMessage]:
    """The messages one run added to ``thread`` (its request first)."""
    config = {"configurable": {"thread_id": thread}}
    state = agent.get_state(config)
    before = len(state.values.get("messages", [])) if state.values else 0
    out = agent.invoke({"messages": [HumanMessage(request)]}, config)
    return out["messages"][before:]


def _shape(run: list[BaseMessage]) -> list[tuple]:
    """A run without its random parts (tool-call and message ids)."""
    out = []
    for m in run:
        if isinstance(m, AIMessage):
            out.append(("ai", m.content, [(c["name"], c["args"]) for c in m.tool_calls]))
        else:
            out.append((m.type, m.content))
    return out


@pytest.fixture(scope="module")
def session() -> list[list[BaseMessage]]:
    """Every demo request, in order, on one thread: the runs' messages."""
    agent = _agent()
    return [_run(agent, "demo", request) for request in DEMO_REQUESTS]


# ---------------------------------------------------------------- the tool loop
def test_every_demo_request_runs_a_tool_loop_that_ends_with_a_labelled_answer(session):
    assert 5 <= len(DEMO_REQUESTS) <= 6
    ids = []
    for request, run in zip(DEMO_REQUESTS, session, strict=True):
        assert isinstance(run[0], HumanMessage) and run[0].content == request
        ais = [m for m in run if isinstance(m, AIMessage)]
        tools = [m for m in run if isinstance(m, ToolMessage)]
        assert 3 <= len(tools) <= 8, (request, len(tools))
        for ai in ais:
            assert ai.content.startswith(f"{LABEL} "), ai.content[:60]
            assert ai.response_metadata["model_name"] == "scripted"
            usage = ai.usage_metadata
            assert usage and usage["input_tokens"] > 0 and usage["output_tokens"] > 0
            assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        for ai in ais[:-1]:
            assert 1 <= len(ai.tool_calls) <= 3
            ids += [c["id"] for c in ai.tool_calls]
        final = run[-1]
        assert isinstance(final, AIMessage) and not final.tool_calls  # the run's final answer
        assert len(final.content) > 400
        # every call has its result, in order, and every result is the tool's text
        calls = [c for ai in ais for c in ai.tool_calls]
        assert [t.tool_call_id for t in tools] == [c["id"] for c in calls]
        for tool in tools:
            assert tool.status != "error" and not tool.content.startswith("error:"), tool.content
    assert len(ids) == len(set(ids)), "tool-call ids repeat"


def test_tool_answers_carry_the_fixture_text(session):
    tools = [m.content for run in session for m in run if isinstance(m, ToolMessage)]
    log = (FIXTURES / "logs" / "checkout-api" / "checkout-api-6f7d9-2.log").read_text()
    first_warn = next(line for line in log.splitlines() if "slow connection acquire" in line)
    assert "14:04:51.200Z" in first_warn
    assert any(first_warn in t for t in tools)  # a log line word for word
    assert any('DB_POOL_MAX: "10"' in t and "a41d2e0" in t for t in tools)  # the deploy's diff
    assert any(re.search(r"checkout-api-6f7d9-2 +0/1 +Running", t) for t in tools)  # not ready
    assert any("14:05:00" in t and "2.41" in t for t in tools)  # the p99 table


def test_the_session_is_well_past_the_compaction_threshold(session):
    sizes = [total_chars(run) for run in session]
    assert sum(sizes) >= 150_000, sizes  # default SUMMARIZATION_THRESHOLD_CHARS: 60,000
    assert max(sizes) >= 40_000, sizes  # one run alone outgrows the keep window twice
    for run in session:
        for m in run:
            if isinstance(m, ToolMessage):
                assert len(m.content) <= MAX_CHARS


# ---------------------------------------------------------------- stateless, deterministic
def test_two_threads_interleaved_get_the_same_plans(session):
    model = ScriptedChatModel()  # one instance for both threads, as in the API process
    agent = _agent(model)
    a, b = [], []
    for request in DEMO_REQUESTS:
        a.append(_run(agent, "a", request))
        b.append(_run(agent, "b", request))
    for x, y, ref in zip(a, b, session, strict=True):
        assert _shape(x) == _shape(y) == _shape(ref)


def test_steps_interleaved_across_threads_at_the_model_level():
    """Two conversations advanced one model call at a time, alternately."""
    model = ScriptedChatModel()
    threads: list[list[BaseMessage]] = [
        [HumanMessage(DEMO_REQUESTS[4])],
        [SystemMessage("sys"), HumanMessage(DEMO_REQUESTS[0])],
    ]
    texts: list[list[str]] = [[], []]
    for _ in range(6):
        for k, messages in enumerate(threads):
            answer = model.invoke(messages)
            texts[k].append(answer.content)
            messages.append(answer)
            for call in answer.tool_calls:
                messages.append(ToolMessage("ok", tool_call_id=call["id"]))
    want = [
        [f"{LABEL} {s.text}" for s in scripted.REPLICAS.steps],
        [f"{LABEL} {s.text}" for s in scripted.TRIAGE.steps],
    ]
    for got, steps in zip(texts, want, strict=True):
        assert got[: len(steps)] == steps
        assert all(t == steps[-1] for t in got[len(steps) :])  # past the end: the answer again


def test_the_plans_call_the_tools_with_valid_arguments():
    names = {t.name: t for t in SRE_TOOLS}
    for plan in [*scripted.PLANS, scripted.generic_plan("anything")]:
        *steps, final = plan.steps
        assert not final.calls and 3 <= sum(len(s.calls) for s in steps) <= 8
        for step in steps:
            assert 1 <= len(step.calls) <= 3
            for name, args in step.calls:
                names[name].args_schema.model_validate(args)


def test_requests_pick_their_plans_by_keywords_and_unknown_text_gets_a_generic_look():
    for plan in scripted.PLANS:
        assert plan_for(plan.request) is plan
        assert plan_for(f"  {plan.request.upper()}  ") is plan
    assert plan_for("Is the DB slow?").key == "database"
    assert plan_for("what changed in yesterday's release").key == "deploy"
    assert plan_for("Check redis and the nodes please").key == "infra"
    generic = plan_for("Why is the email-notifier restarting?")
    assert generic.key == "generic"
    assert generic.steps[0].calls[0][1]["selector"] == "app=email-notifier"
    assert plan_for("hello").steps[0].calls[0][1]["selector"] == "app=checkout-api"


def test_an_unknown_request_runs_the_generic_plan_and_says_it_is_scripted():
    run = _run(_agent(), "g", "Why is the email-notifier restarting?")
    tools = [m for m in run if isinstance(m, ToolMessage)]
    assert len(tools) == 4 and "email-notifier-74c1d-1" in tools[0].content
    assert "OOMKilled" in tools[0].content
    assert "scripted demo model" in run[-1].content and "not an LLM" in run[-1].content
    assert all(r in run[-1].content for r in DEMO_REQUESTS)


def test_a_run_cut_into_a_compaction_continues_its_plan():
    """The run's own request went into the summary: the kept AI messages (or the request the
    summary quotes) say which plan and which step come next."""
    model = ScriptedChatModel()
    request = DEMO_REQUESTS[4]
    first = model.invoke([HumanMessage(request)])
    second = model.invoke(
        [HumanMessage(request), first]
        + [ToolMessage("x", tool_call_id=c["id"]) for c in first.tool_calls]
    )
    digest = build_summary_message(
        message_id="m1",
        summary_text="Earlier: the triage.",
        replaced_ids=["m1", "m2"],
        replaced_chars=50_000,
        summarizer="offline",
        compactions=1,
        request=request,
    )
    kept = [second] + [ToolMessage("x", tool_call_id=c["id"]) for c in second.tool_calls]
    plan, step = locate([SystemMessage("sys"), digest, *kept])
    assert (plan.key, step) == ("replicas", 2)
    plan, step = locate([SystemMessage("sys"), digest])  # nothing kept: from the quoted request
    assert (plan.key, step) == ("replicas", 0)
    # a summary before a new request: the request counts
    plan, step = locate([digest, AIMessage("old"), HumanMessage(DEMO_REQUESTS[3])])
    assert (plan.key, step) == ("deploy", 0)


def test_delay_and_tool_binding():
    model = ScriptedChatModel(delay_s=0.05)
    assert model.bind_tools(SRE_TOOLS, tool_choice="auto") is model
    t0 = time.perf_counter()
    model.invoke([HumanMessage(DEMO_REQUESTS[0])])
    assert time.perf_counter() - t0 >= 0.05


# ---------------------------------------------------------------- the tools
@pytest.mark.parametrize(
    ("tool", "args", "words"),
    [
        (get_logs, {"service": "payments-api"}, "unknown service 'payments-api'"),
        (get_logs, {"service": "checkout-api-6f7d9-2"}, "that is a pod of checkout-api"),
        (get_logs, {"service": "checkout-api", "pod": "zz-9"}, "no pod 'zz-9'"),
        (get_logs, {"service": "checkout-api", "since": "yesterday"}, "is not a time"),
        (get_logs, {"service": "checkout-api", "since": "14:10", "until": "14:00"}, "not before"),
        (get_logs, {"service": "checkout-api", "limit": 0}, "limit must be at least 1"),
        (query_metrics, {"query": "no_such_metric"}, "no fixture series"),
        (query_metrics, {"query": ""}, "empty query"),
        (query_metrics, {"query": "go_goroutines", "start": "14:00", "step": "soon"}, "step="),
        (query_metrics, {"query": 'go_goroutines{pod=~"("}'}, "bad regex"),
        (recent_deploys, {"service": "payments-api"}, "no release named"),
        (recent_deploys, {"service": "checkout-api", "limit": -1}, "limit must be at least 1"),
        (pod_status, {"namespace": "kube-nowhere"}, "no namespace"),
        (pod_status, {"selector": "a=b=c"}, "cannot parse selector"),
    ],
)
def test_bad_arguments_get_an_error_answer_not_an_exception(tool, args, words):
    answer = tool.invoke(args)
    assert answer.startswith("error: ") and words in answer, answer


def test_unknown_service_through_the_agent_is_a_tool_answer():
    model = ScriptedChatModel()
    agent = _agent(model)
    run = _run(agent, "u", "What is wrong with payments-api?")  # generic plan: checkout-api
    assert isinstance(run[-1], AIMessage)
    out = get_logs.invoke({"service": "payments-api", "grep": "("})
    assert out.startswith("error: unknown service")


def test_a_badly_typed_argument_is_an_error_tool_message_in_the_agent():
    """Type errors are caught by the agent's tool node before the tool runs (an LLM reads
    them and retries); the tools themselves answer every well-typed argument."""

    class Replay(FakeMessagesListChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Replay:
            return self

    call = {"name": "get_logs", "args": {"service": "checkout-api", "limit": "lots"}, "id": "c1"}
    model = Replay(responses=[AIMessage("", tool_calls=[call]), AIMessage("done")])
    out = create_agent(model, SRE_TOOLS).invoke({"messages": [HumanMessage("x")]})
    tool = out["messages"][2]
    assert isinstance(tool, ToolMessage) and tool.status == "error" and "limit" in tool.content
    assert out["messages"][-1].content == "done"


def test_missing_fixtures_are_an_error_answer(tmp_path, monkeypatch):
    monkeypatch.setenv("DEMO_FIXTURES_DIR", str(tmp_path / "nowhere"))
    for tool, args in [
        (get_logs, {"service": "checkout-api"}),
        (query_metrics, {"query": "go_goroutines"}),
        (recent_deploys, {"service": "checkout-api"}),
        (pod_status, {}),
    ]:
        answer = tool.invoke(args)
        assert answer.startswith("error: no SRE fixtures at") and "nowhere" in answer


def test_answers_are_capped_and_say_what_was_cut():
    logs = get_logs.invoke({"service": "checkout-api", "limit": 2000})
    assert len(logs) <= MAX_CHARS and "earlier matching lines not shown" in logs
    assert logs.splitlines()[1].endswith("matching lines")
    table = query_metrics.invoke({"query": "http_server_requests:rate1m", "start": "13:30"})
    assert len(table) <= MAX_CHARS and "rows cut" in table
    few = get_logs.invoke({"service": "checkout-api", "pod": "6f7d9-2", "grep": "pool initialised"})
    assert "1 matching lines" in few and "max=10 acquire_timeout_ms=2000" in few


def test_metrics_match_by_name_labels_and_aggregation():
    codes = query_metrics.invoke(
        {
            "query": 'sum by (code) (rate(http_server_requests_total{service="checkout-api"}[1m]))',
            "end": "14:16",
        }
    )
    assert '{code="503"}  14.22' in codes
    pool = query_metrics.invoke(
        {
            "query": 'db_pool_max{service="checkout-api"}',
            "start": "13:50",
            "end": "14:05",
            "step": "5m",
        }
    )
    assert "50" in pool and "10" in pool and "step=300s" in pool
    ratio = query_metrics.invoke(
        {"query": "service:http_server_requests_5xx:ratio_rate1m", "end": "14:04"}
    )
    assert 'service="checkout-api"' in ratio


def test_time_arguments_accept_clock_iso_and_relative_forms():
    a = get_logs.invoke(
        {"service": "checkout-api", "pod": "6f7d9-2", "since": "14:04:51", "until": "14:04:52"}
    )
    b = get_logs.invoke(
        {
            "service": "checkout-api",
            "pod": "checkout-api-6f7d9-2",
            "since": "2025-03-11T14:04:51Z",
            "until": "2025-03-11T14:04:52+00:00",
        }
    )
    assert a == b and "slow connection acquire" in a
    for since in ("2m", "2m ago", "now-2m", "now - 120s", "1741703280"):
        recent = get_logs.invoke({"service": "cart-cache", "since": since})
        assert "2025-03-11T14:28:00Z .. now" in recent, since


# ---------------------------------------------------------------- the fixture files
def test_the_fixtures_generator_is_deterministic_and_matches_the_committed_files(tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    procs = [
        subprocess.Popen([sys.executable, str(GENERATOR), "--out", str(out)], cwd=ROOT)
        for out in outs
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    trees = [
        {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }
        for root in (*outs, FIXTURES)
    ]
    assert trees[0] == trees[1], "two runs wrote different bytes"
    assert trees[0].keys() == trees[2].keys()
    stale = [name for name in trees[0] if trees[0][name] != trees[2][name]]
    assert not stale, f"examples/sre is not what the generator writes: {stale}"
    size = sum(map(len, trees[2].values()))
    assert 500_000 < size < 3_000_000, size
    lines = sum(v.count(b"\n") for k, v in trees[2].items() if k.startswith("logs/"))
    assert lines >= 10_000


def test_the_demo_prepares_from_one_fixed_point():
    """Issue 21, item 10: the middleware's prepare point moves between the prepare floor and
    the size a compaction is worth it from, with the run's growth per second (the machine's
    speed); the demo sets SUMMARIZATION_PREPARE_AT so that the floor is under the latter and
    the point is the floor at every run."""
    from offpath.cli.demo import fixed_prepare_at
    from offpath.compaction.planner import earliest_worth
    from offpath.compaction.settings import Settings

    defaults = Settings()
    share = fixed_prepare_at(defaults)
    # 60,000 / 20,000: an early plan keeps half the window (10,000), a cut needs half a
    # 12,000-char result's allowance (6,000) and 20,000 removed (twice the 10,000 gain)
    assert share == 0.6
    demo = Settings(summarization_prepare_at=share)
    assert demo.prepare_floor_chars == 36_000 <= earliest_worth(demo)
    # already low enough: the configured share is kept
    assert fixed_prepare_at(Settings(summarization_prepare_at=0.5)) is None
