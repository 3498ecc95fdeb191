"""Shaping a model call (:class:`Shaping`): older and new tool results shortened (originals
archived), what the model is sent (orphans dropped, masking over the hard limit), the
thread's fixed part and its budget, and the model's answer with the chars-per-token
calibration."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from langchain.agents.middleware.types import (
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain_core.messages import BaseMessage
from langgraph.types import Command

from offpath.agent.middleware.counting import ThreadSettings, ThreadTokens
from offpath.agent.middleware.pools import Background
from offpath.agent.middleware.reports import Reports, log
from offpath.agent.middleware.state import Call, Write, outside_chars, sending
from offpath.compaction.accounting import message_chars
from offpath.compaction.planner import ThreadBudget, thread_budget
from offpath.compaction.shorten import shorten_each
from offpath.compaction.tokens import Calibration
from offpath.compaction.tracking import MessageSizes, ThreadSize, mask_observations
from offpath.coordination.logs import tag
from offpath.coordination.outages import USAGE_DB
from offpath.coordination.runtime import Client
from offpath.stores import archive
from offpath.stores.db.tables import record_masking
from offpath.stores.tenants import note_fixed


class Shaping:
    """What a model call sends and what comes back with its answer.

    Requires: the settings in force, the client (opened on first use), the background
    threads, the reports, the threads' :class:`~offpath.agent.middleware.counting.
    ThreadTokens`, the agent's :class:`~offpath.compaction.tokens.Calibration`, ``recall``
    (a shortened result says how to read its original) and ``patch`` (offpath's own API
    agent). Provides: :meth:`budget`, :meth:`shorten`, :meth:`replaced`, :meth:`shape`,
    :meth:`count_masking`, :meth:`answer`."""

    def __init__(
        self,
        settings: ThreadSettings,
        client: Callable[[], Client],
        background: Background,
        reports: Reports,
        tokens: ThreadTokens,
        calibration: Calibration,
        *,
        recall: bool,
        patch: bool,
    ) -> None:
        self.settings = settings
        self.client = client
        self.background = background
        self.reports = reports
        self.tokens = tokens
        self.calibration = calibration
        self.recall = recall
        self.patch = patch

    def budget(
        self, session_id: str, messages: list[BaseMessage], out: int, private: dict[str, Any]
    ) -> ThreadBudget:
        """The thread's keep window, summary budget and least gain from its fixed part (``out``,
        what the call sends besides the thread, and the system messages at its head), as the
        planner derives them (:func:`~offpath.compaction.planner.thread_budget`); kept in the
        private key for the prepare point and the session's row (an own agent's:
        :meth:`~offpath.agent.middleware.sessions.Sessions.note_soon`). A fixed part over the
        threshold is said once per thread, in the log and in the session's row of offpath's
        own agent (``/readyz``, the session's page)."""
        fixed = out
        for m in messages:
            if m.type != "system":
                break
            fixed += message_chars(m)
        budget = thread_budget(self.settings.current, fixed)
        private["fixed"] = budget.fixed
        if budget.over and not self.reports.said(f"fixed:{session_id}"):
            self.reports.warn_once(
                f"fixed:{session_id}", f"[{tag(session_id)}] offpath: {budget.warning()}"
            )
            if self.patch:  # an own agent's thread is noted with it (Sessions.note_soon)
                engine = self.client().engine
                self.background.write(
                    note_fixed, engine, session_id, budget.fixed, budget.threshold
                )
        return budget

    def answer(self, call: Call, response: Any) -> Any:
        self._calibrate(call.chars, response, call.session_id)
        if isinstance(response, ModelResponse):
            return ExtendedModelResponse(
                model_response=response, command=Command(update=call.update)
            )
        return ExtendedModelResponse(
            model_response=ModelResponse(result=[response]), command=Command(update=call.update)
        )

    def _calibrate(self, chars: int, response: Any, session_id: str | None = None) -> None:
        """Add the call to :attr:`calibration` (arithmetic only: the provider counted the
        tokens); once calibrated, say once if CHARS_PER_TOKEN is over 10% off the ratio."""
        result = response.result if isinstance(response, ModelResponse) else [response]
        answer = next((m for m in result if getattr(m, "usage_metadata", None)), None)
        if answer is None or not self.calibration.observe(chars, answer):
            return
        if session_id is not None:
            self.tokens.observe(session_id, chars, answer)
        c, s = self.calibration, self.settings.current
        if s.summarization_threshold_tokens:
            return  # each thread's own ratio scales its sizes (.counting): nothing to set
        if c.calibrated and abs(c.chars_per_token / s.chars_per_token - 1) > 0.1:
            self.reports.warn_once(
                "chars_per_token",
                f"the model's provider reports {c.chars_per_token:.2f} chars per input token "
                f"over {c.calls} calls; CHARS_PER_TOKEN is {s.chars_per_token:g}",
            )

    def shape(
        self,
        request: ModelRequest,
        messages: list[BaseMessage],
        size: ThreadSize,
        session_id: str | None,
    ) -> ModelRequest:
        """What the model is sent: ``messages`` without orphan tool results, the oldest tool
        results masked if it would still be over the hard limit, then the oldest AI messages'
        text and call arguments if that is not enough (the system prompt counted: DESIGN.md
        invariant 13, every call; :func:`~offpath.compaction.tracking.mask_observations`)."""
        sent = messages
        if size.orphans:
            orphans = set(size.orphans)
            sent = [m for m in messages if m.id not in orphans]
        limit = self.settings.current.hard_limit_chars
        system_chars = outside_chars(request)
        if self.settings.current.active and size.chars + system_chars > limit:
            sent, masking = mask_observations(sent, limit - system_chars)
            hid = masking.results + masking.messages
            if hid:
                sid = session_id or "?"
                # a warning at a thread's first masking in the process, then INFO lines (each
                # one is counted in /stats' fallback_maskings)
                first = self.reports.first(f"masked:{sid}")
                log.log(
                    logging.WARNING if first else logging.INFO,
                    "[%s] context over its hard limit (%d > %d chars) with no summary ready: "
                    "masked %d old tool results and %d old AI messages (%d chars) for this call",
                    tag(sid),
                    size.chars + system_chars,
                    limit,
                    masking.results,
                    masking.messages,
                    masking.chars,
                )
                if session_id is not None:
                    self.background.write(self.count_masking, session_id, hid, masking.chars)
        if sent is request.messages:
            return request
        return sending(request, sent)

    def shorten(
        self,
        session_id: str,
        messages: list[BaseMessage],
        caps: dict[str, int],
        why: str,
        floor: int | None = None,
        writes: list[Write] | None = None,
        at: Mapping[str, int] | None = None,
    ) -> list[BaseMessage]:
        """``messages`` with the messages named in ``caps`` shortened to their cap (not below
        ``floor``), their originals archived (:func:`archive.store_shortened`): first, or,
        given ``writes``, while the model answers (the write is added to ``writes``;
        :meth:`~offpath.agent.middleware.applying.Applying.settle` waits for it before the
        update is returned). Nothing shortened if the archive cannot be written first. ``at``: the index of each message named in ``caps``
        (when known: no other message is looked at)."""
        try:
            out, originals = shorten_each(messages, caps, recall=self.recall, floor=floor, at=at)
            if originals:
                write = partial(
                    archive.store_shortened, self.client().engine, session_id, originals
                )
                if writes is None:
                    write()
                else:
                    writes.append((None, write))
        except Exception as exc:  # unarchived, nothing is shortened: the hard limit still holds
            line = f"[{tag(session_id)}] could not archive results to shorten: {exc}"
            self.reports.trouble(USAGE_DB, exc, line)
            return messages
        if out is not messages:
            saved = sum(message_chars(m) - message_chars(out[i]) for i, m in originals)
            log.info(
                "[%s] shortened %d message(s) %s: -%d chars (originals archived)",
                tag(session_id),
                len(originals),
                why,
                saved,
            )
        return out

    def replaced(
        self,
        session_id: str,
        sizes: MessageSizes,
        before: list[BaseMessage],
        after: list[BaseMessage],
        at: Iterable[int],
    ) -> list[int]:
        """The positions of ``at`` where ``after`` (``before`` with messages shortened in
        place) holds another message: sized again, and counted again in tokens."""
        changed = [i for i in at if after[i] is not before[i]]
        if changed:
            sizes.replaced(changed, after)
            self.tokens.replaced(session_id, [(before[i], after[i]) for i in changed])
        return changed

    def count_masking(self, session_id: str, results: int, chars: int) -> None:
        """Count a masking of ``results`` messages (``chars``) in the thread's usage rows
        (``/stats``' ``fallback_maskings``)."""
        try:
            record_masking(self.client().engine, session_id, results, chars)
        except Exception as exc:
            line = f"[{tag(session_id)}] could not count a masking: {exc}"
            self.reports.trouble(USAGE_DB, exc, line)
            return
        self.reports.answered(USAGE_DB)
