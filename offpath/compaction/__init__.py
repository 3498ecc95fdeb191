"""Compaction core: what to compact and how, as plain functions with no I/O.

One job's path through it: :func:`plan_compaction` (where to cut) ->
:func:`build_prompt` (what the summarizer reads) -> a :class:`Summarizer` ->
:class:`Prepared` (the plan and its summary, kept until applied) -> :func:`fit` (does it
still fit the thread? the update for LangGraph's ``add_messages``).

Imports nothing else of offpath: every other layer builds on it (``tests/test_layout.py``).
"""
