"""Compact, then revert, gives back exactly the originals (issue 19; DESIGN.md invariant 16):
1,000 random threads through the real planner and ``fit`` (a long request's copy, kept results
shortened, messages that came while the summary was written removed too, a summary of an
earlier compaction folded in), archived as the apply paths archive them, then reverted by
:func:`offpath.compaction.revert.reverted` from the archive rows alone. The thread after the
revert is, message for message in ``messages_to_dict`` form, the thread before the
compaction with what came after it appended. The API does the same on real processes:
``tests/integration/test_revert.py``."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
    messages_to_dict,
)
from langgraph.graph.message import add_messages

from offpath.compaction.patch import Prepared, Stale, fit
from offpath.compaction.planner import Skip, landing_chars, plan_compaction
from offpath.compaction.revert import RevertConflict, reverted
from offpath.config import load_settings
from offpath.stores.archive import REMOVED, SHORTENED, rows_for

WORDS = st.sampled_from(
    ["checkout-api", "OPS-4711", "OOMKilled", "10.42.1.7", "lag 30s", "ok", "retry", "pool"]
)
TEXT = st.lists(WORDS, min_size=1, max_size=8).map(" ".join)


@st.composite
def threads(draw) -> tuple[list[BaseMessage], int]:
    """A thread (system prompt maybe, an earlier summary maybe, turns of calls and results,
    some large, parallel calls, a call left waiting) and how many of its messages existed
    when the compaction was planned (the rest came while its summary was written)."""
    counter = iter(range(10**6))

    def nid(prefix: str) -> str:
        return f"{prefix}-{next(counter)}"

    msgs: list[BaseMessage] = []
    if draw(st.booleans()):
        msgs.append(SystemMessage(id=nid("sys"), content="You are an SRE agent."))
    if draw(st.booleans()):
        msgs.append(
            HumanMessage(
                id=nid("sum"),
                content="Summary of the conversation so far\n\n**Investigating:** x",
                additional_kwargs={"lc_source": "summarization", "summary": {"compactions": 1}},
            )
        )
    for _ in range(draw(st.integers(2, 6))):
        ask = draw(TEXT)
        if draw(st.integers(0, 2)) == 0:  # a long request: kept as a copy after the summary
            ask = (ask + " ") * draw(st.integers(40, 200))
        msgs.append(
            HumanMessage(id=nid("h"), content=ask, name=draw(st.sampled_from([None, "bo"])))
        )
        for _ in range(draw(st.integers(0, 5))):
            calls = [
                {
                    "id": nid("c"),
                    "name": "kubectl",
                    "args": {"cmd": "get pods"},
                    "type": "tool_call",
                }
                for _ in range(draw(st.integers(1, 3)))
            ]
            msgs.append(AIMessage(id=nid("a"), content="", tool_calls=calls))
            for call in calls:
                size = draw(st.sampled_from([1, 10, 100, 400]))
                msgs.append(
                    ToolMessage(
                        id=nid("t"),
                        tool_call_id=call["id"],
                        content=f"{size} rows\n" + "pod ok 10.42.1.7\n" * size,
                        status=draw(st.sampled_from(["success", "error"])),
                    )
                )
        msgs.append(AIMessage(id=nid("r"), content=draw(TEXT)))
    planned = draw(st.integers(max(1, len(msgs) * 2 // 3), len(msgs)))
    return msgs, planned


#: Threshold and keep window (chars) -> settings (made once: a load reads the environment).
SETTINGS = {
    (t, k): load_settings(summarization_threshold_chars=t, summarization_keep_chars=k)
    for t, k in [(2_000, 700), (4_000, 1_500), (8_000, 3_000)]
}


def later_messages(k: int) -> list[BaseMessage]:
    """Messages that come after the compaction was applied."""
    return [
        HumanMessage(id=f"later-h{k}", content="and now?"),
        AIMessage(id=f"later-a{k}", content="checking"),
    ][: 1 + k % 2]


def as_dicts(messages: list[BaseMessage]) -> str:
    return json.dumps(messages_to_dict(messages), sort_keys=True)


def compacted(messages, planned, settings, bounded):
    """The thread once a compaction planned on its first ``planned`` messages is applied to it
    whole, and the archive rows it writes; None if none applies."""
    plan = plan_compaction(messages[:planned], settings, force=True)
    if isinstance(plan, Skip):
        return None
    prepared = Prepared.from_plan(
        plan, job_id="j", summary_text="Checked the pods.", summarizer="t", model="m"
    )
    target = landing_chars(settings) if bounded else None
    fitted = fit(prepared, messages, target=target, settings=settings)
    if isinstance(fitted, Stale):
        fitted = fit(prepared, messages)
    if isinstance(fitted, Stale):
        return None
    rows = rows_for("s", "j", str(fitted.summary.id), messages, fitted.removed, fitted.shortened)
    return add_messages(messages, fitted.patch), rows, fitted


def revert_from(thread, rows, record):
    removed = [
        (r["position"], messages_from_dict([r["message"]])[0]) for r in rows if r["kind"] == REMOVED
    ]
    shortened = [messages_from_dict([r["message"]])[0] for r in rows if r["kind"] == SHORTENED]
    return reverted(
        thread, record["summary_id"], removed, shortened, request_copy=record["request_copy"]
    )


@hyp_settings(
    max_examples=1_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    threads(),
    st.sampled_from(sorted(SETTINGS)),
    st.booleans(),
    st.integers(0, 3),
)
def test_compact_then_revert_gives_back_exactly_the_originals(case, sizes, bounded, later):
    messages, planned = case
    settings = SETTINGS[sizes]
    done = compacted(messages, planned, settings, bounded)
    if done is None:
        event("no compaction")
        return
    after, rows, fitted = done
    event(f"removed late: {fitted.record['since_summary'] > 0}")
    event(f"results shortened: {bool(fitted.shortened)}")
    event(f"request copy: {fitted.record['request_copy'] is not None}")
    tail = later_messages(later) if later else []
    back = revert_from([*after, *tail], rows, fitted.record)
    assert as_dicts(back) == as_dicts([*messages, *tail])


def test_a_removed_id_used_again_after_the_compaction_is_a_conflict():
    messages = [HumanMessage(id=f"h{k}", content="check it " * 300) for k in range(12)]
    after, rows, fitted = compacted(messages, len(messages), SETTINGS[(2_000, 700)], False)
    reused = HumanMessage(id=fitted.removed[-1], content="a client sent this id again")
    with pytest.raises(RevertConflict, match="used again"):
        revert_from([*after, reused], rows, fitted.record)


def test_a_shortened_result_gone_from_the_thread_is_a_conflict():
    msgs: list[BaseMessage] = []
    for k in range(10):
        call = {"id": f"c{k}", "name": "logs", "args": {}, "type": "tool_call"}
        msgs += [
            HumanMessage(id=f"h{k}", content=f"shard {k}?"),
            AIMessage(id=f"a{k}", content="", tool_calls=[call]),
            ToolMessage(id=f"t{k}", tool_call_id=f"c{k}", content="row ok\n" * 400),
        ]
    after, rows, fitted = compacted(msgs, len(msgs), SETTINGS[(4_000, 1_500)], True)
    assert fitted.shortened, "the case must shorten a kept result"
    gone = [m for m in after if m.id != fitted.shortened[0]]
    with pytest.raises(RevertConflict, match="no longer in the thread"):
        revert_from(gone, rows, fitted.record)


def test_a_thread_without_the_summary_is_a_conflict():
    messages = [HumanMessage(id=f"h{k}", content="check it " * 300) for k in range(12)]
    after, rows, fitted = compacted(messages, len(messages), SETTINGS[(2_000, 700)], False)
    without = [m for m in after if m.id != fitted.summary.id]
    with pytest.raises(RevertConflict, match="not in the thread"):
        revert_from(without, rows, fitted.record)


def test_a_long_request_kept_as_a_copy_goes_back_as_the_original():
    """The copy takes the second removed message's id: it goes, the original comes back (a
    case the random threads reach in about 1% of examples, so pinned down here)."""
    msgs: list[BaseMessage] = [
        SystemMessage(id="sys", content="You are an SRE agent."),
        HumanMessage(id="h0", content="investigate the checkout outage " * 30),
    ]
    for k in range(10):
        call = {"id": f"c{k}", "name": "logs", "args": {}, "type": "tool_call"}
        msgs += [
            AIMessage(id=f"a{k}", content="", tool_calls=[call]),
            ToolMessage(id=f"t{k}", tool_call_id=f"c{k}", content="row ok\n" * 100),
        ]
    after, rows, fitted = compacted(msgs, len(msgs), SETTINGS[(4_000, 1_500)], True)
    assert fitted.record["request_copy"] == "h0"
    assert [m.id for m in after][1:3] == ["h0", "a0"]  # the summary, then the copy
    back = revert_from([*after, *later_messages(1)], rows, fitted.record)
    assert as_dicts(back) == as_dicts([*msgs, *later_messages(1)])
