"""DESIGN.md invariant 20: a summary keeps its budget. The whole summary message as it lands in
the thread (frontier, findings, pinned facts, the sections added at the apply, the archive's
index) holds at most the thread's summary budget (``SUMMARY_MAX_SHARE`` x the threshold,
:func:`thread_budget`), at every threshold and with every summarizer, and no line of it
repeats another. Shared transcripts are looped into long sessions, compacted again and again,
each compaction applied late (after the next messages came), so that the check before the
swap and the since-section add their lines."""

from __future__ import annotations

import itertools

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langgraph.graph.message import add_messages
from shared import SHARED, check_compacted, load, messages_of

from offpath.compaction.accounting import message_chars
from offpath.compaction.patch import Fitted, Prepared, fit
from offpath.compaction.planner import Skip, landing_chars, plan_compaction, thread_budget
from offpath.compaction.prompt import build_prompt
from offpath.compaction.summarizers.guarded import GuardedSummarizer
from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.compaction.summary import REQUEST_HEADING, is_summary
from offpath.config import load_settings
from offpath.llm import LLMSummarizer

THRESHOLDS = (10_000, 30_000, 60_000, 100_000, 200_000)
TRANSCRIPTS = ("holmesgpt-backend-perf", "sweagent-pydicom-1458", "miniswe-django-11910")

#: An LLM's answer that fills its room with generic lines (it names nothing): the guard's
#: sections come on top of it.
GENERIC = "\n".join(
    [
        "**Investigating:** the reported problem, as the user described it",
        "**Key findings:**",
        *(f"- finding {k}: the service was checked and its state was noted" for k in range(60)),
        "**Ruled out:** nothing ruled out yet",
        "**Current state:** the agent is checking the next component",
    ]
)


def summarizer(kind: str, settings):
    if kind == "offline":
        inner = OfflineSummarizer()
    else:
        model = GenericFakeChatModel(messages=itertools.repeat(AIMessage(content=GENERIC)))
        inner = LLMSummarizer(model, "fake")
    return GuardedSummarizer(inner, settings.summary_pinned_max_chars)


def looped(name: str, loops: int) -> list[BaseMessage]:
    """The transcript's messages ``loops`` times (its system prompt once), fresh ids each loop."""
    original = messages_of(load(SHARED / "transcripts" / f"{name}.json"))
    out: list[BaseMessage] = []
    for k in range(loops):
        for m in original:
            if m.type == "system" and k:
                continue
            out.append(m.model_copy(update={"id": f"l{k}-{m.id}"}))
    return out


def session_summaries(name: str, threshold: int, kind: str, loops: int = 3):
    """Replay ``name`` looped: each time the thread crosses its threshold, plan and summarize,
    let the next messages (up to the next request, at most 6) come, then fit and apply the
    compaction as the worker does. Yields ``(summary message, its budget, the fit's record)``
    per compaction."""
    settings = load_settings(
        summarization_threshold_chars=threshold, summarization_keep_chars=threshold // 3
    )
    guarded = summarizer(kind, settings)
    incoming = looped(name, loops)
    thread: list[BaseMessage] = []
    at = 0
    while at < len(incoming):
        thread = add_messages(thread, [incoming[at]])
        at += 1
        if sum(message_chars(m) for m in thread) <= threshold:
            continue
        plan = plan_compaction(thread, settings)
        if isinstance(plan, Skip):
            continue
        result = guarded.summarize(
            plan, build_prompt(plan, settings.summarization_max_prompt_chars)
        )
        prepared = Prepared.from_plan(
            plan, job_id="j", summary_text=result.text, summarizer="s", model="m", meta=result.meta
        )
        late = 0
        while at < len(incoming) and late < 6:  # the thread moves on while it is summarized
            came = incoming[at]
            if late and came.type == "human":
                break
            thread = add_messages(thread, [came])
            at += 1
            late += 1
        fitted = fit(prepared, thread, target=landing_chars(settings), settings=settings)
        if not isinstance(fitted, Fitted):
            continue
        after = add_messages(thread, fitted.patch)
        check_compacted(thread, after)
        thread = after
        fixed = sum(message_chars(m) for m in thread if m.type == "system")
        yield fitted.summary, thread_budget(settings, fixed).summary, fitted.record


def repeated(content: str) -> list[str]:
    """The lines of ``content`` that repeat another, but in the quoted request (word for word
    by design: its code may close two brackets alike)."""
    content = content.partition(f"\n\n{REQUEST_HEADING}\n")[0]
    lines = [" ".join(x.split()) for x in content.splitlines()]
    lines = [x for x in lines if x]
    return sorted({x for x in lines if lines.count(x) > 1})


@pytest.mark.parametrize("kind", ["offline", "llm"])
@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("name", TRANSCRIPTS)
def test_a_summary_keeps_its_budget_and_repeats_no_line(name, threshold, kind):
    seen = swapped = 0
    for summary, budget, record in session_summaries(name, threshold, kind):
        seen += 1
        swapped += record["checked_at_swap"] > 0
        content = str(summary.content)
        assert is_summary(summary)
        assert len(content) <= budget, (
            f"compaction {seen}: {len(content)} chars over the budget {budget}\n{content}"
        )
        assert not repeated(content), f"compaction {seen} repeats {repeated(content)}"
    if threshold <= 60_000:
        assert seen >= 2, "the looped session was compacted at least twice"
    if name == "miniswe-django-11910" and threshold <= 30_000:  # its loops name old ids
        assert swapped, "the check before the swap pinned lines at some compaction"
