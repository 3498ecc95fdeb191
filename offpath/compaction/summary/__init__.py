"""The summary message: how it looks, how it is recognised, what it carries.

A summary is a ``HumanMessage`` whose content is the seed's prefix line, a blank
line, then the summary text (the seed: "Replace old messages with one
HumanMessage containing the structured summary"). When a cut fell inside a turn,
that turn's request follows under :data:`REQUEST_HEADING`, word for word, unchanged.

It is marked in ``additional_kwargs`` so that a later compaction folds it into
the next summary instead of keeping two::

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
