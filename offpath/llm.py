"""The LLM summarizer: ``ChatOpenAI`` against any OpenAI-compatible endpoint, and
:func:`make_summarizer`, which picks the summarizer a process uses from its settings.

The summarizer backends of the pure core (:mod:`offpath.compaction.summarizers`: the
protocol, the offline one, the fact guard) do no I/O; this one calls the network, so it
sits outside the core, beside the settings' loading (``tests/test_layout.py``).

Configured by ``SUMMARIZATION_MODEL``, ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``SUMMARIZATION_TIMEOUT_S``, ``SUMMARIZATION_MAX_RETRIES`` (the client's own
retries, with its backoff) and ``SUMMARIZATION_MAX_OUTPUT_TOKENS``. Errors are
mapped to :class:`TransientSummarizerError` (timeouts, 429, 5xx, connection) or
:class:`SummarizerError`; an empty answer raises :class:`EmptySummaryError`, an answer
that is not the template, or a refusal written inside it, :class:`MalformedSummaryError`,
and one cut at the output limit (``finish_reason: length``) is summarized again from inputs
half the size, then raises :class:`TruncatedSummaryError`: none is ever applied. Lines of the answer that read as
instructions to an assistant (injected text the model copied) are dropped.
"""

from __future__ import annotations

import dataclasses
import logging

import openai
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from offpath.compaction.planner import CompactionPlan
from offpath.compaction.prompt import SummaryPrompt, build_prompt, chunks
from offpath.compaction.settings import MIN_PROMPT_CHARS, Settings
from offpath.compaction.summarizers.base import (
    EmptySummaryError,
    MalformedSummaryError,
    Summarizer,
    SummarizerError,
    SummaryResult,
    TransientSummarizerError,
    TruncatedSummaryError,
)
from offpath.compaction.summarizers.guarded import GuardedSummarizer
from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.compaction.summary import (
    SUMMARY_PREFIX,
    SUMMARY_SOURCE,
    fit_text,
    refusal_problem,
    strip_instructions,
    template_problem,
    text_cap,
)

log = logging.getLogger("offpath.summarizer")

#: Hard cap on a summary's length in chars, whatever the model writes (~4x the 400 words).
MAX_SUMMARY_CHARS = 10_000
#: Most model calls one summary takes when what it removes does not fit one prompt.
MAX_CALLS = 4
#: The endpoint when ``OPENAI_BASE_URL`` is unset. Given to the client explicitly: left out,
#: the client would read ``OPENAI_BASE_URL`` / ``OPENAI_API_BASE`` from the process's
#: environment, not from the settings it was made from (DESIGN.md invariant 19).
OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"


class LLMSummarizer:
    """Summarizes with a chat model (``ChatOpenAI`` in production, any ``BaseChatModel`` in tests)."""

    def __init__(
        self, model: BaseChatModel, model_name: str, max_prompt_chars: int = 60_000
    ) -> None:
        self.model = model
        self.model_name = model_name
        self.name = llm_name(model_name)
        self.max_prompt_chars = max(max_prompt_chars, MIN_PROMPT_CHARS)

    @classmethod
    def from_settings(cls, settings: Settings) -> LLMSummarizer:
        """A ``ChatOpenAI`` client from the settings (no network call is made here)."""
        from langchain_openai import ChatOpenAI

        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
        model = ChatOpenAI(
            model=settings.summarization_model,
            api_key=key or "not-needed",  # local OpenAI-compatible servers take any key
            base_url=settings.openai_base_url or OPENAI_DEFAULT_BASE_URL,
            timeout=settings.summarization_timeout_s,
            max_retries=settings.summarization_max_retries,
            max_completion_tokens=settings.summarization_max_output_tokens,
            temperature=0,
        )
        return cls(model, settings.summarization_model, settings.summarization_max_prompt_chars)

    def summarize(self, plan: CompactionPlan, prompt: SummaryPrompt) -> SummaryResult:
        """The summary of ``plan.removed``: one call when its prompt holds every removed
        message, else one call per chunk of them (:func:`~offpath.compaction.prompt.chunks`,
        at most :data:`MAX_CALLS`), each chunk's summary folded into the next prompt as the
        earlier summary, so the model reads everything it removes. Raises on error
        or an empty or malformed answer; tokens are summed over the calls."""
        try:
            return self._summarize(plan, prompt, self.max_prompt_chars)
        except TruncatedSummaryError as exc:
            # cut at its output limit: never applied; once more on inputs half the size (more
            # calls, each writing less), else the job fails saying so
            smaller = max(MIN_PROMPT_CHARS, self.max_prompt_chars // 2)
            if smaller >= self.max_prompt_chars:
                raise
            log.warning("%s; summarizing again in smaller parts", exc)
            return self._summarize(plan, build_prompt(plan, smaller), smaller)

    def _summarize(
        self, plan: CompactionPlan, prompt: SummaryPrompt, max_chars: int
    ) -> SummaryResult:
        parts = chunks(plan, max_chars, MAX_CALLS, prompt.sizes)
        if len(parts) == 1:
            return self._call(plan, prompt)
        carried: BaseMessage | None = None
        result = None
        used_in = used_out = 0
        for k, part in enumerate(parts):
            if carried is not None:
                part = dataclasses.replace(part, removed=(carried, *part.removed))
            result = self._call(part, build_prompt(part, max_chars))
            used_in += result.input_tokens
            used_out += result.output_tokens
            carried = HumanMessage(
                id=f"chunk-{k}",
                content=f"{SUMMARY_PREFIX}\n\n{result.text}",
                additional_kwargs={"lc_source": SUMMARY_SOURCE},
            )
        assert result is not None
        log.info("summarized %d removed messages in %d calls", len(plan.removed), len(parts))
        return dataclasses.replace(result, input_tokens=used_in, output_tokens=used_out)

    def _call(self, plan: CompactionPlan, prompt: SummaryPrompt) -> SummaryResult:
        """Call the model once (plus the client's retries); raise on error or empty text."""
        try:
            answer = self.model.invoke(
                [SystemMessage(content=prompt.system), HumanMessage(content=prompt.user)]
            )
        # the errors say what failed in offpath's words (they are stored in the job's row and
        # shown by /stats and the UI); the LLM's own text goes to the log
        except openai.RateLimitError as exc:
            raise TransientSummarizerError(
                _logged("LLM rate limited (429)", exc), _retry_after(exc)
            ) from exc
        except openai.InternalServerError as exc:
            raise TransientSummarizerError(
                _logged(f"LLM server error ({exc.status_code})", exc), _retry_after(exc)
            ) from exc
        except openai.APITimeoutError as exc:
            raise TransientSummarizerError(_logged("LLM call timed out", exc)) from exc
        except openai.APIConnectionError as exc:
            raise TransientSummarizerError(_logged("LLM unreachable", exc)) from exc
        except openai.APIStatusError as exc:
            raise SummarizerError(
                _logged(f"LLM refused the request ({exc.status_code})", exc)
            ) from exc
        except Exception as exc:  # a malformed answer, a client bug: never a summary
            raise SummarizerError(_logged(f"LLM call failed ({type(exc).__name__})", exc)) from exc
        text = str(answer.text).strip()
        finish = (getattr(answer, "response_metadata", None) or {}).get("finish_reason")
        if finish == "length":
            raise TruncatedSummaryError(
                "the LLM's summary was cut at its output limit (finish_reason: length; "
                "SUMMARIZATION_MAX_OUTPUT_TOKENS)"
            )
        if not text:
            raise EmptySummaryError("the LLM answered with an empty summary")
        if problem := template_problem(text) or refusal_problem(text):
            raise MalformedSummaryError(f"malformed summary: {problem}")
        text, dropped = strip_instructions(text)
        if dropped:
            log.warning("dropped %d line(s) of the summary that read as instructions", dropped)
        cap = min(MAX_SUMMARY_CHARS, text_cap(plan.summary_chars) or MAX_SUMMARY_CHARS)
        if len(text) > cap:  # the summary budget, whatever the model wrote
            text = fit_text(text, cap)
        usage = getattr(answer, "usage_metadata", None) or {}
        return SummaryResult(
            text=text,
            model=self.model_name,
            input_tokens=int(usage.get("input_tokens", 0) or 0),
            output_tokens=int(usage.get("output_tokens", 0) or 0),
        )


def _retry_after(exc: openai.APIStatusError) -> float | None:
    try:
        value = exc.response.headers.get("retry-after")
        return float(value) if value is not None else None
    except (AttributeError, ValueError):
        return None


def _logged(what: str, exc: BaseException) -> str:
    """``what`` (the error's message: offpath's words only); the exception's own text, which
    may quote the prompt or the endpoint's answer, is logged at WARNING."""
    log.warning("%s: %s", what, _short(exc))
    return what


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


def make_summarizer(settings: Settings) -> Summarizer:
    """The LLM summarizer when an LLM is configured (``OPENAI_API_KEY`` or ``OPENAI_BASE_URL``),
    else the offline one; either behind the fact guard (``SUMMARY_PINNED_MAX_CHARS``)."""
    inner: Summarizer
    if settings.llm_configured:
        inner = LLMSummarizer.from_settings(settings)
    else:
        inner = OfflineSummarizer()
    return GuardedSummarizer(inner, settings.summary_pinned_max_chars)


def summarizer_name(settings: Settings) -> str:
    """The ``name`` of :func:`make_summarizer`'s summarizer for ``settings`` (what jobs record
    and start-up lines say), without making it: no ChatOpenAI client is made for a name."""
    if settings.llm_configured:
        return llm_name(settings.summarization_model)
    return OfflineSummarizer.name


def llm_name(model_name: str) -> str:
    """The name an :class:`LLMSummarizer` of ``model_name`` goes by (``llm:<model>``), in
    jobs' records and start-up lines."""
    return f"llm:{model_name}"
