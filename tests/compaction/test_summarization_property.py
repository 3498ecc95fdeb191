"""Hypothesis: for any valid conversation and any settings, a compaction keeps the
DESIGN.md invariants and the prompt stays within its budget (issue 2)."""

from __future__ import annotations

from hypothesis import HealthCheck, event, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.graph.message import add_messages
from shared import check_compacted, pairing_problems

from offpath.compaction.patch import Stale, fit
from offpath.compaction.pipeline import Compaction, compact, compact_plan
from offpath.compaction.planner import Skip, landing_chars, plan_compaction
from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.compaction.summary import SUMMARY_PREFIX
from offpath.config import load_settings

TEXT = st.text(alphabet="abc xyz 0123456789:-\n", min_size=0, max_size=40).map(lambda s: s * 30)
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "iVBORw0KGgo" * 2000}}


@st.composite
def conversations(draw):
    counter = iter(range(10**6))

    def nid(prefix):
        return f"{prefix}-{next(counter)}"

    # some servers number calls per response: every turn's first call is "tool:0"
    per_response_ids = draw(st.booleans())
    msgs = []
    if draw(st.booleans()):
        msgs.append(SystemMessage(id=nid("sys"), content=draw(TEXT)))
    if draw(st.booleans()):
        msgs.append(
            HumanMessage(
                id=nid("sum"),
                content=f"{SUMMARY_PREFIX}\n\n**Investigating:** x\n**Key findings:**\n- a 1",
                additional_kwargs={"lc_source": "summarization", "summary": {"compactions": 1}},
            )
        )
    for _ in range(draw(st.integers(1, 6))):
        content = draw(TEXT)
        if draw(st.integers(0, 5)) == 0:
            content = [{"type": "text", "text": content}, IMAGE]
        elif draw(st.integers(0, 8)) == 0:  # a pasted note that opens like a summary
            content = f"{SUMMARY_PREFIX}\n\n{content}"
        msgs.append(HumanMessage(id=nid("h"), content=content))
        for _ in range(draw(st.integers(0, 6))):
            n_calls = draw(st.integers(0, 3))
            calls = [
                {
                    "id": f"tool:{k}" if per_response_ids else nid("call"),
                    "name": "tool",
                    "args": {"q": draw(TEXT)},
                    "type": "tool_call",
                }
                for k in range(n_calls)
            ]
            msgs.append(AIMessage(id=nid("ai"), content=draw(TEXT), tool_calls=calls))
            results = [
                ToolMessage(id=nid("t"), content=draw(TEXT), tool_call_id=c["id"]) for c in calls
            ]
            results = list(draw(st.permutations(results))) if results else []
            if results and draw(st.integers(0, 4)) == 0:  # a message between call and result
                results.insert(
                    draw(st.integers(0, len(results) - 1)), HumanMessage(id=nid("h"), content="fyi")
                )
            msgs.extend(results)
        if draw(st.integers(0, 8)) == 0:  # an orphan result, left by another framework's trim
            msgs.append(ToolMessage(id=nid("t"), content=draw(TEXT), tool_call_id=nid("gone")))
        if draw(st.integers(0, 6)) == 0:  # a call never answered (broken input, or pending)
            msgs.append(
                AIMessage(
                    id=nid("ai"),
                    content="",
                    tool_calls=[{"id": nid("call"), "name": "x", "args": {}, "type": "tool_call"}],
                )
            )
        msgs.append(AIMessage(id=nid("ai"), content=draw(TEXT)))
    if draw(st.booleans()):  # a call still waiting for its result, maybe answered in part
        calls = [
            {"id": nid("call"), "name": "approve", "args": {}, "type": "tool_call"}
            for _ in range(2)
        ]
        msgs.append(AIMessage(id=nid("ai"), content="waiting", tool_calls=calls))
        if draw(st.booleans()):
            msgs.append(ToolMessage(id=nid("t"), content="ok", tool_call_id=calls[0]["id"]))
    return msgs


@st.composite
def compaction_settings(draw):
    threshold = draw(st.integers(500, 40_000))
    keep = draw(st.integers(0, threshold - 1))
    prompt = draw(st.integers(4_000, 30_000))
    return load_settings(
        summarization_threshold_chars=threshold,
        summarization_keep_chars=keep,
        summarization_max_prompt_chars=prompt,
    )


@hyp_settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), compaction_settings())
def test_summarization_property_invariants(messages, settings):
    outcome = compact(messages, settings, OfflineSummarizer())
    event(f"outcome: {getattr(outcome, 'reason', 'compacted')}")
    if isinstance(outcome, Skip):
        return
    assert isinstance(outcome, Compaction)
    assert outcome.prompt.chars <= settings.summarization_max_prompt_chars
    assert "iVBORw0KGgoiVBORw0KGgo" not in outcome.prompt.user
    after = add_messages(messages, outcome.patch)
    check_compacted(messages, after)
    # orphan results are removed by the compaction, wherever they stood
    assert not [p for p in pairing_problems(after) if p.startswith("result:")]
    # a second compaction right away folds the first summary: still one summary
    again = compact(after, settings, OfflineSummarizer())
    if isinstance(again, Compaction):
        check_compacted(after, add_messages(after, again.patch))


@st.composite
def later_turns(draw, start: int):
    """Whole turns (a request, calls with their results, an answer) that arrive after a plan,
    with ids of their own, and maybe a last turn still in progress (no answer yet)."""
    out = []
    for t in range(draw(st.integers(1, 5))):
        out.append(HumanMessage(id=f"late-h{start}-{t}", content=draw(TEXT) or "next?"))
        for k in range(draw(st.integers(0, 3))):
            cid = f"late-c{start}-{t}-{k}"
            out += [
                AIMessage(
                    id=f"late-a{start}-{t}-{k}",
                    content="",
                    tool_calls=[{"id": cid, "name": "tool", "args": {}, "type": "tool_call"}],
                ),
                ToolMessage(id=f"late-t{start}-{t}-{k}", content=draw(TEXT), tool_call_id=cid),
            ]
        out.append(AIMessage(id=f"late-f{start}-{t}", content=draw(TEXT) or "done"))
    if draw(st.booleans()):
        out.pop()  # the last turn is still in progress
    return out


@hyp_settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), compaction_settings(), st.data())
def test_a_late_apply_keeps_every_turn_whole(messages, settings, data):
    """DESIGN.md invariant 17 on the apply: a compaction prepared on a thread and applied
    after whole turns came (a slow summarizer, turns arriving meanwhile) removes whole turns or
    none of them, whether it goes deeper to land under its target or not; or it is stale."""
    plan = plan_compaction(messages, settings, early=True)
    if isinstance(plan, Skip):
        return
    outcome = compact_plan(plan, messages, settings, OfflineSummarizer())
    grown = [*messages, *data.draw(later_turns(len(messages)))]
    for target in (None, landing_chars(settings)):
        fitted = fit(outcome.prepared, grown, target=target, settings=settings)
        event(f"target {'set' if target else 'none'}: {type(fitted).__name__}")
        if isinstance(fitted, Stale):
            continue
        check_compacted(grown, add_messages(grown, fitted.patch))
