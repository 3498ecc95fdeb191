"""The summary message: how it looks, how it is recognised, what it carries.

A summary is a ``HumanMessage`` whose content is the seed's prefix line, a blank
line, then the summary text (the seed: "Replace old messages with one
HumanMessage containing the structured summary"). When a cut fell inside a turn,
that turn's request follows under :data:`REQUEST_HEADING`, word for word, unchanged
(issue 2, item 3).

It is marked in ``additional_kwargs`` so that a later compaction folds it into
the next summary instead of keeping two (issue 2, item 6)::

    additional_kwargs = {
        "lc_source": "summarization",
        "summary": {
            "replaced_ids": [...],        # ids of the messages this compaction removed
            "replaced_count": 14,
            "replaced_chars": 42000,     # chars they held (accounting.message_chars)
            "summarizer": "llm:gpt-4o-mini" | "offline",
            "compactions": 3,            # how many compactions this summary folds in
            "request": "..." | None,     # the open turn's request, word for word
            # and what the worker adds: job_id, model, input/output tokens, latency_ms
        },
    }

The parts: :mod:`.message` (the message, its template and metadata) and
:mod:`.instructions` (the filter that keeps injected instructions out of a summary).
"""

# the filter's whole pattern and its rule, which the tests check the gates against
from offpath.compaction.summary.instructions import _INSTRUCTION as _INSTRUCTION
from offpath.compaction.summary.instructions import _instruction_rule as _instruction_rule
from offpath.compaction.summary.instructions import (
    looks_like_instruction,
    may_hold_instruction,
    normalized,
    strip_instructions,
)
from offpath.compaction.summary.message import (
    CITED_UUID_CHARS,
    HEADINGS,
    MAX_COMPACTIONS,
    RECALL_NOTE,
    REQUEST_HEADING,
    SUMMARY_PREFIX,
    SUMMARY_SOURCE,
    build_summary_message,
    cite,
    compactions_of,
    fingerprint,
    fit_text,
    is_summary,
    overhead_chars,
    refusal_problem,
    summary_body,
    summary_meta,
    summary_request,
    template_problem,
    text_cap,
    words_for,
)

__all__ = [
    "CITED_UUID_CHARS",
    "HEADINGS",
    "MAX_COMPACTIONS",
    "RECALL_NOTE",
    "REQUEST_HEADING",
    "SUMMARY_PREFIX",
    "SUMMARY_SOURCE",
    "build_summary_message",
    "cite",
    "compactions_of",
    "fingerprint",
    "fit_text",
    "is_summary",
    "looks_like_instruction",
    "may_hold_instruction",
    "normalized",
    "overhead_chars",
    "refusal_problem",
    "strip_instructions",
    "summary_body",
    "summary_meta",
    "summary_request",
    "template_problem",
    "text_cap",
    "words_for",
]
