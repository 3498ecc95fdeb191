"""Compaction core: what to compact and how, as plain functions with no I/O.

One job's path through it: :func:`plan_compaction` (where to cut) ->
:func:`build_prompt` (what the summarizer reads) -> a :class:`Summarizer` ->
:class:`Prepared` (the plan and its summary, kept until applied) -> :func:`fit` (does it
still fit the thread? the update for LangGraph's ``add_messages``).

Imports nothing else of offpath: every other layer builds on it (``tests/test_layout.py``).
"""

from offpath.compaction.accounting import message_chars, total_chars
from offpath.compaction.pairing import new_unpaired, pair_messages, without_orphans
from offpath.compaction.patch import Fitted, Prepared, Stale, fit, landed
from offpath.compaction.planner import CompactionPlan, Skip, SkipReason, plan_compaction
from offpath.compaction.prompt import SummaryPrompt, build_prompt
from offpath.compaction.settings import Settings, SettingsError, get_settings, load_settings
from offpath.compaction.summarizers import Summarizer, SummarizerError, make_summarizer
from offpath.compaction.summary import SUMMARY_PREFIX, is_summary

__all__ = [
    "SUMMARY_PREFIX",
    "CompactionPlan",
    "Settings",
    "SettingsError",
    "Skip",
    "SkipReason",
    "Fitted",
    "Prepared",
    "Stale",
    "Summarizer",
    "SummarizerError",
    "SummaryPrompt",
    "build_prompt",
    "fit",
    "get_settings",
    "is_summary",
    "landed",
    "load_settings",
    "make_summarizer",
    "message_chars",
    "new_unpaired",
    "pair_messages",
    "plan_compaction",
    "total_chars",
    "without_orphans",
]
