"""A compaction prepared on one turn, applied after the next turn's long request arrived
(SWE-agent sends a 19k-char demonstration and a 4.6k-char issue as two user messages each
time it starts a task): the request of the turn in progress stays whole, no cut may remove
it, so the apply lands as low as it can beside it rather than going stale. Stale, the
thread waited over its threshold for a new summary on every such turn (benchmark 20 at
30,000 / 10,000 with a 1 s summarizer: 90 of 351 model calls over the threshold)."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph.message import add_messages

from offpath.compaction.accounting import message_chars, total_chars
from offpath.compaction.patch import Prepared, Stale, fit
from offpath.compaction.planner import landing_bound, plan_compaction
from offpath.config import load_settings

OUTSIDE = 4_900  # a system prompt given to create_agent: sent with every call


def step(k: int, size: int) -> list:
    return [
        AIMessage(
            id=f"a{k}",
            content=f"Step {k}: editing `handler_{k}.py`.",
            tool_calls=[{"id": f"c{k}", "name": "edit", "args": {"file": f"handler_{k}.py"}}],
        ),
        ToolMessage(
            id=f"t{k}",
            tool_call_id=f"c{k}",
            content=f"[File handler_{k}.py]\n" + "x = 1\n" * (size // 6),
        ),
    ]


def test_a_long_request_arriving_while_the_summary_was_written_does_not_make_it_stale():
    settings = load_settings(summarization_threshold_chars=30_000, summarization_keep_chars=10_000)
    thread: list = [HumanMessage(id="h0", content="Fix the pixel handler in `handler_3.py`.")]
    k = 0
    while total_chars(thread) + OUTSIDE < settings.prepare_floor_chars:
        thread += step(k, 2_400)
        k += 1
    thread.append(AIMessage(id="done0", content="Fixed in `handler_3.py`."))
    plan = plan_compaction(thread, settings, early=True, outside_chars=OUTSIDE)
    assert not hasattr(plan, "reason"), plan
    prepared = Prepared.from_plan(
        plan, job_id="j1", summary_text="**Investigating:** the handler", summarizer="t", model="m"
    )
    # the next task starts while the summary is written: two long user messages, applied at
    # the model call they are sent with
    demo = HumanMessage(id="demo1", content="Here is a demonstration.\n" + "demo line\n" * 1_700)
    issue = HumanMessage(id="issue1", content="Solve this issue.\n" + "issue text\n" * 420)
    thread += [demo, issue]
    before = total_chars(thread) + OUTSIDE
    assert before > settings.summarization_threshold_chars

    fitted = fit(
        prepared,
        thread,
        target=settings.prepare_floor_chars,
        settings=settings,
        outside_chars=OUTSIDE,
    )

    assert not isinstance(fitted, Stale), fitted.reason
    after = add_messages(list(thread), fitted.patch)
    ids = {m.id for m in after}
    assert {"demo1", "issue1"} <= ids  # the request of the turn in progress stays
    size = total_chars(after) + OUTSIDE
    request = message_chars(demo) + message_chars(issue)
    assert size < before
    # as low as the rest allows: under the bound a request kept as its own message gets
    assert size <= landing_bound(settings, OUTSIDE, request)
    assert size - request <= settings.prepare_floor_chars
    shortened = {m.id: m for m in fitted.patch if m.id == "demo1"}
    assert shortened and "demo1" in fitted.shortened  # archived whole, recall reads the rest
    assert message_chars(shortened["demo1"]) < message_chars(demo)
