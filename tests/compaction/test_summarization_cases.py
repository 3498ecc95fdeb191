"""Every file in ../shared/cases is a test of the planner and the patch (issue 2).

The case's ``expect`` keys are the assertions; the patch is applied with
LangGraph's real ``add_messages``.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph.message import add_messages
from shared import CASES, check_case, load, messages_of
from shared import settings_of as case_settings

from offpath.compaction.pipeline import Compaction, compact
from offpath.compaction.planner import Skip, plan_compaction
from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.config import load_settings

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
    if isinstance(outcome, Skip):
        after, prompts, queued = before, [], 0
    else:
        assert isinstance(outcome, Compaction)
        after = add_messages(before, outcome.patch)
        prompts, queued = [outcome.prompt.system + outcome.prompt.user], 1
    # the post-turn hook enqueues exactly when the planner returns a plan
    check_case(
        doc,
        before,
        after,
        prompts=prompts,
        jobs_queued=queued,
        offline_summary=True,
        state_after=doc.get("state_extra", {}),
    )
    if expect.get("no_requeue_loop"):
        _assert_no_requeue_loop(after, settings)


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
