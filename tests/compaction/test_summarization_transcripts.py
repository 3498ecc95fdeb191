"""Every transcript in ../shared/transcripts, planned at the default settings and at a
small threshold: the DESIGN.md invariants hold on the patched thread (issue 2)."""

from __future__ import annotations

import pytest
from langgraph.graph.message import add_messages
from shared import TRANSCRIPTS, check_compacted, load, messages_of

from offpath.compaction.accounting import message_chars
from offpath.compaction.pipeline import Compaction, compact
from offpath.compaction.planner import Skip, SkipReason
from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.config import load_settings

SETTINGS = {
    "default": {},
    "small": {"summarization_threshold_chars": 8_000, "summarization_keep_chars": 3_000},
}


@pytest.mark.parametrize("name", SETTINGS)
@pytest.mark.parametrize("path", TRANSCRIPTS, ids=lambda p: p.stem)
def test_summarization_transcript_invariants(path, name):
    settings = load_settings(**SETTINGS[name])
    before = messages_of(load(path))
    total = sum(message_chars(m) for m in before)
    outcome = compact(before, settings, OfflineSummarizer())
    if total <= settings.summarization_threshold_chars:
        assert isinstance(outcome, Skip) and outcome.reason is SkipReason.UNDER_THRESHOLD
        return
    assert isinstance(outcome, Compaction), (
        f"{path.stem} over the threshold was not compacted: {outcome}"
    )
    after = add_messages(before, outcome.patch)
    check_compacted(before, after)
    assert outcome.prompt.chars <= settings.summarization_max_prompt_chars
    assert sum(message_chars(m) for m in after) < total


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=lambda p: p.stem)
def test_summarization_repeated_compaction_keeps_invariants(path):
    """Compact, then replay the thread's own messages again on top, ten times: every
    round keeps one summary first and never orphans a call."""
    settings = load_settings(summarization_threshold_chars=8_000, summarization_keep_chars=3_000)
    original = messages_of(load(path))
    thread = []
    for round_ in range(3):
        for m in original:
            if m.type == "system" and round_:
                continue
            thread = add_messages(thread, [m.model_copy(update={"id": f"r{round_}-{m.id}"})])
        outcome = compact(thread, settings, OfflineSummarizer())
        if isinstance(outcome, Compaction):
            after = add_messages(thread, outcome.patch)
            check_compacted(thread, after)
            thread = after
