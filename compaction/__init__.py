"""Compaction core: what to compact and how, as plain functions with no I/O.

One job's path through it: :func:`plan_compaction` (where to cut) ->
:func:`build_prompt` (what the summarizer reads) -> a :class:`Summarizer` ->
:func:`reconcile` (does the plan still fit the thread?) -> :func:`summary_message`
and :func:`build_patch` (the update for LangGraph's ``add_messages``).
"""

from compaction.accounting import message_chars, total_chars
from compaction.pairing import new_unpaired, pair_messages, without_orphans
from compaction.patch import Stale, build_patch, reconcile, summary_message
from compaction.planner import CompactionPlan, Skip, SkipReason, plan_compaction
from compaction.prompt import SummaryPrompt, build_prompt
from compaction.settings import Settings, SettingsError, get_settings, load_settings
from compaction.summarizers import Summarizer, SummarizerError, make_summarizer
from compaction.summary import SUMMARY_PREFIX, is_summary

__all__ = [
    "SUMMARY_PREFIX",
    "CompactionPlan",
    "Settings",
    "SettingsError",
    "Skip",
    "SkipReason",
    "Stale",
    "Summarizer",
    "SummarizerError",
    "SummaryPrompt",
    "build_patch",
    "build_prompt",
    "get_settings",
    "is_summary",
    "load_settings",
    "make_summarizer",
    "message_chars",
    "new_unpaired",
    "pair_messages",
    "plan_compaction",
    "reconcile",
    "summary_message",
    "total_chars",
    "without_orphans",
]
