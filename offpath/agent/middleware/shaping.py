"""Shaping a model call: older and new tool results shortened (originals archived), what the
model is sent (orphans dropped, masking over the hard limit), its answer and the
chars-per-token calibration, and the prepare point (the run's growth rate and the
summarizer's latency) with the crossing that frees a thread."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from langchain.agents.middleware.types import (
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain_core.messages import BaseMessage
from langgraph.types import Command

from offpath.agent.middleware.helpers import _outside, log, outside_chars
from offpath.agent.middleware.state import _Call, _Write
from offpath.compaction.accounting import message_chars
from offpath.compaction.planner.budgets import (
    ThreadBudget,
    earliest_worth,
    prepare_from_chars,
    thread_budget,
)
from offpath.compaction.shorten import shorten_each
from offpath.compaction.sizing import MessageSizes
from offpath.compaction.tracking import ThreadSize, mask_observations
from offpath.coordination.logs import tag
from offpath.coordination.outages import USAGE_DB
from offpath.stores import archive
from offpath.stores.leases.claims import Claim
from offpath.stores.tenants import note_fixed
from offpath.stores.usage.totals import summarizer_latency_p90_s

#: How often (s) the summarizer's latency p90 is read again, and what it is assumed to be
#: before any compaction of the deployment measured it.
LATENCY_REFRESH_S = 60.0
DEFAULT_LATENCY_S = 5.0
#: Seconds a job takes beyond its summarizer: publish, a worker taking it, the checkpoint
#: catching up with the run (LangGraph writes it in the background), storing the result.
JOB_OVERHEAD_S = 1.5
#: Weight of the newest sample in the run's growth rate (exponential moving average).
RATE_WEIGHT = 0.5


class ShapingMixin:
    """:class:`~offpath.agent.middleware.OffPathCompaction`'s shaping of a model call
    (shortening, masking, the answer and its calibration) and its prepare point. Its methods
    use the attributes set in ``OffPathCompaction.__init__``."""

    def _crossing_frees(self, holder: Claim | None, reached: int, private: dict[str, Any]) -> bool:
        """A skip decided under the threshold frees a thread that crossed it (``reached``:
        its size before this call shortened older results), once until the next compaction
        is applied: the thread's counted size is held near the prepare floor by that
        shortening, so the skip's gain rule alone would hold it while every call goes over
        the threshold (benchmark 17, sre-75k-dump at 20,000 / 6,000: one job in 34 calls; a
        pure replay held it from call 4 to call 13). A job queued so, which then finds
        nothing worth compacting, leaves a skip decided under the threshold again: the
        ``crossed`` flag stops a job per call."""
        if holder is None or private.get("crossed"):
            return False
        if not holder.frees_for(reached, self._min_gain, self._threshold):
            return False
        private["crossed"] = True
        return True

    def _budget(
        self, session_id: str, messages: list[BaseMessage], out: int, private: dict[str, Any]
    ) -> ThreadBudget:
        """The thread's keep window, summary budget and least gain from its fixed part (``out``,
        what the call sends besides the thread, and the system messages at its head), as the
        planner derives them (:func:`~offpath.compaction.planner.thread_budget`); kept in the
        private key for the prepare point and the session's row (an own agent's:
        :meth:`_note`). A fixed part over the threshold is said once per thread, in the log and
        in the session's row of offpath's own agent (``/readyz``, the session's page)."""
        fixed = out
        for m in messages:
            if m.type != "system":
                break
            fixed += message_chars(m)
        budget = thread_budget(self.settings, fixed)
        private["fixed"] = budget.fixed
        if budget.over and f"fixed:{session_id}" not in self._warned:
            self._warn_once(
                f"fixed:{session_id}", f"[{tag(session_id)}] offpath: {budget.warning()}"
            )
            if self.options.patch:  # an own agent's thread is noted with it (_note)
                engine = self.client.engine
                self._write(note_fixed, engine, session_id, budget.fixed, budget.threshold)
        return budget

    def _answer(self, call: _Call, response: Any) -> Any:
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
        c = self.calibration
        if self.settings.summarization_threshold_tokens:
            return  # each thread's own ratio scales its sizes (.counting): nothing to set
        if c.calibrated and abs(c.chars_per_token / self.settings.chars_per_token - 1) > 0.1:
            self._warn_once(
                "chars_per_token",
                f"the model's provider reports {c.chars_per_token:.2f} chars per input token "
                f"over {c.calls} calls; CHARS_PER_TOKEN is {self.settings.chars_per_token:g}"
                + (
                    f": SUMMARIZATION_THRESHOLD_TOKENS={self.settings.summarization_threshold_tokens} "
                    f"triggers at {self.settings.summarization_threshold_chars:,} chars, "
                    f"{c.to_chars(self.settings.summarization_threshold_tokens):,} at the measured "
                    "ratio (set CHARS_PER_TOKEN to it)"
                    if self.settings.summarization_threshold_tokens
                    else ""
                ),
            )

    def _shape(
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
        limit = self.settings.hard_limit_chars
        system_chars = outside_chars(request)
        if self.settings.active and size.chars + system_chars > limit:
            sent, masking = mask_observations(sent, limit - system_chars)
            hid = masking.results + masking.messages
            if hid:
                sid = session_id or "?"
                # a warning at a thread's first masking in the process, then INFO lines (each
                # one is counted in /stats' fallback_maskings)
                first = f"masked:{sid}" not in self._warned
                if first and len(self._warned) < 10_000:
                    self._warned.add(f"masked:{sid}")
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
                    self._write(self._count_masking, session_id, hid, masking.chars)
        if sent is request.messages:
            return request
        return request.override(messages=sent)

    def _shorten(
        self,
        session_id: str,
        messages: list[BaseMessage],
        caps: dict[str, int],
        why: str,
        floor: int | None = None,
        writes: list[_Write] | None = None,
        at: Mapping[str, int] | None = None,
    ) -> list[BaseMessage]:
        """``messages`` with the messages named in ``caps`` shortened to their cap (not below
        ``floor``), their originals archived (:func:`archive.store_shortened`): first, or,
        given ``writes``, while the model answers (the write is added to ``writes``;
        :meth:`_settle` waits for it before the update is returned). Nothing shortened if the
        archive cannot be written first. ``at``: the index of each message named in ``caps``
        (when known: no other message is looked at)."""
        try:
            out, originals = shorten_each(messages, caps, recall=self.recall, floor=floor, at=at)
            if originals:
                write = partial(archive.store_shortened, self.client.engine, session_id, originals)
                if writes is None:
                    write()
                else:
                    writes.append((None, write))
        except Exception as exc:  # unarchived, nothing is shortened: the hard limit still holds
            line = f"[{tag(session_id)}] could not archive results to shorten: {exc}"
            self._trouble(USAGE_DB, exc, line)
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

    def _replaced(
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

    def _apply_sized(
        self,
        session_id: str,
        holder: Claim,
        messages: list[BaseMessage],
        private: dict[str, Any],
        chars: int,
        out: int,
        writes: list[_Write],
        sizes: MessageSizes,
    ) -> tuple[list[BaseMessage], int, bool]:
        """:meth:`_apply_now`, and the thread sized and counted anew if it applied:
        ``(messages, chars, applied)``."""
        after, chars = self._apply_now(session_id, holder, messages, private, chars, out, writes)
        if after is messages:
            return messages, chars, False
        self.tokens.forget(session_id)
        sizes.clear()
        sizes.sync(after)
        return after, chars, True

    def _track_rate(self, private: dict[str, Any], chars: int) -> None:
        """Keep the run's growth in chars per second (a moving average over its model calls)
        in the private key."""
        now = time.time()
        rate = dict(private.get("rate") or {})
        last_t, last_chars = rate.get("t"), rate.get("chars")
        if isinstance(last_t, float | int) and isinstance(last_chars, int):
            dt = now - float(last_t)
            if 0 < dt < 600 and chars > last_chars:
                sample = (chars - last_chars) / dt
                g = rate.get("g")
                rate["g"] = sample if not g else RATE_WEIGHT * sample + (1 - RATE_WEIGHT) * g
        rate["t"], rate["chars"] = now, chars
        private["rate"] = rate

    def _prepare_point(self, private: dict[str, Any]) -> int:
        """The size (chars) from which a job is queued: early enough that its summary is ready
        when the thread crosses its threshold (the run's growth rate x the summarizer's p90
        latency and a job's overhead), never later than the prepare floor
        (``SUMMARIZATION_PREPARE_AT``; for a thread whose fixed part is over it, where a
        compaction lands it and a least gain: :func:`~offpath.compaction.planner.
        prepare_from_chars`), and not before a compaction could be worth it (the keep window, a
        summary's budget and the no-progress gain of the thread, whose fixed part no compaction
        removes: :func:`~offpath.compaction.planner.earliest_worth`). Sizes as a call sends
        them."""
        s = self.settings
        fixed = int(private.get("fixed") or _outside(private))
        floor = prepare_from_chars(s, fixed)  # the prepare floor, unless the fixed part is over
        growth = float((private.get("rate") or {}).get("g") or 0.0)
        if growth <= 0:
            return floor
        lead = growth * (self._latency_p90() + JOB_OVERHEAD_S) * 1.25
        ahead = int(s.summarization_threshold_chars - lead)
        # sizes as a call sends them: a system prompt given to the agent is in every one
        return min(floor, max(earliest_worth(s, fixed), ahead))

    def _latency_p90(self) -> float:
        """The summarizer's p90 latency in seconds over the deployment's recent compactions,
        read in the background at most every :data:`LATENCY_REFRESH_S`."""
        p90, at = self._latency
        if time.monotonic() - at >= LATENCY_REFRESH_S:
            self._latency = (p90, time.monotonic())

            def read() -> None:
                try:
                    value = summarizer_latency_p90_s(self.client.engine)
                except Exception:  # the usage database is away: keep the last figure
                    return
                if value is not None:
                    self._latency = (value, time.monotonic())

            self._read(read)
        return p90
