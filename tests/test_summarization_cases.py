"""Every file in ../shared/cases is a test of the planner and the patch (issue 2).

The case's ``expect`` keys are the assertions; the patch is applied with
LangGraph's real ``add_messages``.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph.message import add_messages
from shared import CASES, check_compacted, load, marked_summary, messages_of, pairing_problems
from shared import settings_of as case_settings

from compaction.pipeline import Compaction, compact
from compaction.planner import Skip, plan_compaction
from compaction.settings import load_settings
from compaction.summarizers.offline import OfflineSummarizer

KNOWN_KEYS = {
    "compacts",
    "enqueued",
    "summary_first",
    "system_untouched",
    "kept_verbatim_ids",
    "no_orphans",
    "no_new_orphans",
    "request_verbatim",
    "single_summary",
    "prompt_must_not_contain",
    "max_prompt_chars",
    "no_requeue_loop",
    "state_extra_preserved",
    "facts_for_fidelity",
    "note",
}


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_summarization_case(path):
    doc = load(path)
    expect = doc["expect"]
    assert set(expect) <= KNOWN_KEYS, f"unknown expect keys {set(expect) - KNOWN_KEYS}"
    settings = load_settings(**case_settings(doc))
    before = messages_of(doc)
    outcome = compact(before, settings, OfflineSummarizer())

    if expect.get("enqueued") is False:
        # the post-turn hook enqueues exactly when the planner returns a plan
        assert isinstance(outcome, Skip), "a job would be queued"
    if not expect.get("compacts", True):
        assert isinstance(outcome, Skip)
        return
    assert isinstance(outcome, Compaction), f"expected a compaction, got {outcome}"
    after = add_messages(before, outcome.patch)
    summary = check_compacted(before, after)  # DESIGN.md invariants hold for every case
    n_sys = sum(1 for m in before[:1] if m.type == "system")

    if expect.get("summary_first"):
        assert after[n_sys] is summary
    if expect.get("system_untouched"):
        assert after[0] == before[0] and after[0].type == "system"
    if ids := expect.get("kept_verbatim_ids"):
        pos = [next(i for i, m in enumerate(after) if m.id == x) for x in ids]
        assert pos == sorted(pos) and pos[0] > n_sys
        by_id = {m.id: m for m in before}
        assert all(after[p] == by_id[x] for p, x in zip(pos, ids, strict=True))
    if expect.get("no_orphans"):
        assert not pairing_problems(after[n_sys + 1 :]) - _pending(after)
    if expect.get("no_new_orphans"):
        assert pairing_problems(after) <= pairing_problems(before)
    if text := expect.get("request_verbatim"):
        assert any(isinstance(m.content, str) and text in m.content for m in after)
    if expect.get("single_summary"):
        assert sum(marked_summary(m) for m in after) == 1
    if bad := expect.get("prompt_must_not_contain"):
        assert bad not in outcome.prompt.system + outcome.prompt.user
    if limit := expect.get("max_prompt_chars"):
        assert outcome.prompt.chars <= limit
    if extra := expect.get("state_extra_preserved"):
        assert extra  # checked on the real checkpoint in the integration tests
    if facts := expect.get("facts_for_fidelity"):
        missing = [f for f in facts if f not in summary.content]
        assert not missing, f"the offline summary lost {missing}"
    if expect.get("no_requeue_loop"):
        _assert_no_requeue_loop(after, settings)


def _pending(messages):
    called = {c["id"] for m in messages for c in (getattr(m, "tool_calls", None) or [])}
    answered = {m.tool_call_id for m in messages if m.type == "tool"}
    return {"call:" + c for c in called - answered}


def _assert_no_requeue_loop(after, settings):
    """20 short turns after the compaction: each job queued must make real progress."""
    thread = list(after)
    jobs = 0
    for i in range(20):
        thread = add_messages(
            thread,
            [
                HumanMessage(id=f"loop-h{i}", content="And now?"),
                AIMessage(id=f"loop-a{i}", content="Checking."),
            ],
        )
        plan = plan_compaction(thread, settings)
        if not isinstance(plan, Skip):
            jobs += 1
            assert (
                plan.total_chars - plan.estimated_chars_after
                >= (settings.summarization_threshold_chars - settings.summarization_keep_chars) // 4
            )
    assert jobs <= 1, f"{jobs} jobs queued by 20 short turns"
