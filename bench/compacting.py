"""What benchmarks 14-16 share: compactions driven in process (no worker, no checkpoint), a
real SQLite archive for ``recall``, an LLM-shaped stub that names nothing, and the text of a
thread as the model reads it.

* :class:`Archive`: a scratch SQLite usage database (``offpath.stores.db.migrate``) that an
  applied compaction's originals go to, as the worker writes them (``archive.rows_for`` and
  ``archive.store_record``, the job row set ``applied``), so ``recall.answer`` finds them;
* :func:`names_nothing`: an LLM-shaped summary (the seed's template, padded with findings
  that name nothing specific, as ``tests/stub_llm.py`` pads its summaries) from a LangChain
  fake chat model; the same object serves offpath's ``LLMSummarizer`` and LangChain's
  ``SummarizationMiddleware``, so both read the same answers;
* :func:`stub_summarizer`: that stub behind the fact guard, as ``make_summarizer`` builds an
  LLM summarizer (``GuardedSummarizer(LLMSummarizer(...), SUMMARY_PINNED_MAX_CHARS)``);
* :func:`view` / :func:`verbatim`: what the model reads of a thread (every message's text
  and tool calls), and the part of it that is original (no summary, no shortened result);
* :class:`Messages`: messages of a scripted session with ids of their own.
"""

from __future__ import annotations

import itertools
import json
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from langchain_core.messages import BaseMessage

from bench.common import ROOT

#: The LLM-shaped stub's answer before padding: the seed's template, no specifics.
NAMES_NOTHING = (
    "**Investigating:** the request the user made.\n**Key findings:**\n"
    "- the agent looked up the records involved and reviewed them\n"
    "**Ruled out:** nothing ruled out yet\n"
    "**Current state:** the agent is working on the request."
)


class Archive:
    """A scratch usage database (SQLite in a temporary directory) holding the originals of
    the compactions a benchmark applies; ``close()`` removes it."""

    def __init__(self) -> None:
        from offpath.config import load_settings
        from offpath.stores.db.engine import make_engine, migrate

        self._tmp = tempfile.TemporaryDirectory(prefix="offpath-bench-")
        # its own SQLite file even when the stack's DATABASE_URL is set: two benchmarks of
        # one run (frontier after groundtruth) numbered their jobs alike in one database
        settings = load_settings(data_dir=self._tmp.name, database_url="")
        migrate(settings)
        self.engine = make_engine(settings)
        self._jobs = itertools.count()

    def applied(
        self,
        session: str,
        thread: Sequence[BaseMessage],
        summary_id: str,
        removed: Sequence[str],
        shortened: Sequence[str] = (),
    ) -> None:
        """Archive the originals a compaction of ``thread`` removes (and the kept results it
        shortens), under a job row set ``applied``, as the worker does before its patch."""
        from offpath.stores import archive
        from offpath.stores.db.tables import JOBS
        from offpath.stores.db.transitions import create_job

        job = f"bench-{next(self._jobs)}"
        rows = archive.rows_for(session, job, summary_id, thread, removed, shortened)
        create_job(self.engine, job, session, None)
        archive.store_record(self.engine, job, {}, rows)
        with self.engine.begin() as conn:
            conn.execute(sa.update(JOBS).where(JOBS.c.job_id == job).values(status="applied"))

    def shortened(self, session: str, originals: Sequence[tuple[int, BaseMessage]]) -> None:
        """Archive the originals of results shortened as they arrived (job id ``""``)."""
        from offpath.stores import archive

        archive.store_shortened(self.engine, session, originals)

    def close(self) -> None:
        self.engine.dispose()
        self._tmp.cleanup()


class OffpathCompactor:
    """offpath at each model call, in process: the tool results that arrived since the last
    call over ``TOOL_RESULT_MAX_CHARS`` are shortened (originals archived), then, when the
    thread is over its threshold, one compaction end to end
    (:func:`offpath.compaction.pipeline.compact`: plan, prompt, ``summarizer``, fit), its
    originals archived. The summary is ready when it is needed: the best case of the
    background job, and what ``SummarizationMiddleware`` does in the request path."""

    def __init__(self, settings: Any, summarizer: Any, archive: Archive) -> None:
        self.settings = settings
        self.summarizer = summarizer
        self.archive = archive
        self.seen: set[str] = set()  # ids of the messages earlier model calls saw

    def before_model(self, session: str, thread: list[Any]) -> tuple[list[Any], Any]:
        """The thread the model call reads, and the compaction applied (None: none)."""
        from langgraph.graph.message import add_messages

        from offpath.compaction.accounting import total_chars
        from offpath.compaction.pipeline import Skip, compact
        from offpath.compaction.shorten import arrival_caps, shorten

        s = self.settings
        new = [m for m in thread if str(m.id) not in self.seen]
        caps = arrival_caps(new, s.tool_result_limit_chars, s.summarization_keep_chars)
        if caps:
            at = {str(m.id): i for i, m in enumerate(thread)}
            self.archive.shortened(session, [(at[i], thread[at[i]]) for i in caps])
            thread = add_messages(thread, [shorten(thread[at[i]], c) for i, c in caps.items()])
        self.seen.update(str(m.id) for m in thread)
        if total_chars(thread) <= s.summarization_threshold_chars:
            return thread, None
        done = compact(thread, s, self.summarizer)
        if isinstance(done, Skip):
            return thread, None
        f = done.fitted
        self.archive.applied(session, thread, str(f.summary.id), f.removed, f.shortened)
        return add_messages(thread, f.patch), done


class Messages:
    """Messages of a scripted session, their ids numbered under ``prefix``; ``rng`` draws
    whatever the script varies."""

    def __init__(self, rng: Any, prefix: str) -> None:
        self.rng = rng
        self.prefix = prefix
        self.k = 0

    def id(self) -> str:
        self.k += 1
        return f"{self.prefix}-{self.k}"

    def human(self, text: str) -> Any:
        from langchain_core.messages import HumanMessage

        return HumanMessage(id=self.id(), content=text)

    def ai(self, text: str) -> Any:
        from langchain_core.messages import AIMessage

        return AIMessage(id=self.id(), content=text)

    def call(self, tool: str, args: dict[str, Any], result: str, thought: str = "") -> list[Any]:
        """A tool call (the agent's message, ``thought`` its text) and its result."""
        from langchain_core.messages import AIMessage, ToolMessage

        call_id = f"call-{self.id()}"
        return [
            AIMessage(
                id=self.id(),
                content=thought,
                tool_calls=[{"id": call_id, "name": tool, "args": args}],
            ),
            ToolMessage(id=self.id(), content=result, tool_call_id=call_id, name=tool),
        ]


def names_nothing(chars: int) -> Any:
    """A fake chat model that answers every prompt with :data:`NAMES_NOTHING` padded to about
    ``chars`` chars with generic findings (``tests/stub_llm.py``'s ``pad_summary``): the length
    of a real model's summary, and none of its specifics."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from stub_llm import pad_summary

    text = pad_summary(NAMES_NOTHING, chars)
    return GenericFakeChatModel(messages=itertools.repeat(AIMessage(text)))


def stub_summarizer(settings: Any, chars: int) -> Any:
    """:func:`names_nothing` as offpath's LLM summarizer behind the fact guard, as
    ``make_summarizer`` builds one when an LLM is configured."""
    from offpath.compaction.summarizers.guarded import GuardedSummarizer
    from offpath.llm import LLMSummarizer

    inner = LLMSummarizer(names_nothing(chars), "names-nothing-stub")
    return GuardedSummarizer(inner, settings.summary_pinned_max_chars)


def text_of(message: BaseMessage) -> str:
    """What the model reads of a message: its text and its tool calls with their arguments."""
    from offpath.compaction.prompt import render_content

    calls = [
        f"{c.get('name')}({json.dumps(c.get('args') or {}, ensure_ascii=False, default=str)})"
        for c in getattr(message, "tool_calls", None) or []
    ]
    return "\n".join([render_content(message.content), *calls])


def is_summary_message(message: BaseMessage) -> bool:
    """A summary offpath or LangChain's ``SummarizationMiddleware`` wrote (both mark it
    ``lc_source: summarization``)."""
    return message.additional_kwargs.get("lc_source") == "summarization"


def view(thread: Sequence[BaseMessage]) -> str:
    """Everything the model reads of ``thread``."""
    return "\n".join(text_of(m) for m in thread)


def verbatim(thread: Sequence[BaseMessage]) -> str:
    """The messages of ``thread`` that are originals: neither a summary nor a tool result
    offpath shortened."""
    from offpath.compaction.shorten import is_shortened

    return "\n".join(
        text_of(m) for m in thread if not is_summary_message(m) and not is_shortened(m)
    )


_HIT = re.compile(r"\n\n(?=\[[^\]\s]+\] \((?:human|ai|tool|system)\) )")


def recall_hits(answer: str) -> list[str]:
    """The excerpts of a ``recall`` answer (words searched), in rank order, with the
    highlight brackets the full-text search puts around matched words removed."""
    if answer.startswith("recall:"):
        return []
    hits = []
    for hit in _HIT.split(answer):
        _, _, excerpt = hit.partition(") ")
        hits.append(excerpt.replace("[", "").replace("]", ""))
    return hits


def data_dir(env: str, names: Sequence[str]) -> tuple[Path | None, str]:
    """The directory named by the environment variable ``env`` that holds one of ``names``
    (directly or under ``historical_trajectories/``), and a line saying what was found."""
    import os

    value = os.environ.get(env, "").strip()
    if not value:
        return None, f"{env} is not set"
    base = Path(value).expanduser()
    if not base.is_absolute():
        base = ROOT / base
    for where in (base, base / "historical_trajectories"):
        if any((where / n).is_file() for n in names):
            return where, f"{env}={value}"
    return None, f"{env}={value} holds none of {', '.join(names)}"
