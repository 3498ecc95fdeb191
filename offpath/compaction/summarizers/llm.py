"""LLM summarizer: ``ChatOpenAI`` against any OpenAI-compatible endpoint.

Configured by ``SUMMARIZATION_MODEL``, ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``SUMMARIZATION_TIMEOUT_S``, ``SUMMARIZATION_MAX_RETRIES`` (the client's own
retries, with its backoff) and ``SUMMARIZATION_MAX_OUTPUT_TOKENS``. Errors are
mapped to :class:`TransientSummarizerError` (timeouts, 429, 5xx, connection) or
:class:`SummarizerError`; an empty answer raises :class:`EmptySummaryError`, an answer
that is not the template :class:`MalformedSummaryError`. Lines of the answer that read as
instructions to an assistant (injected text the model copied) are dropped.
"""

from __future__ import annotations

import logging

import openai
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage

from offpath.compaction.planner import CompactionPlan
from offpath.compaction.prompt import SummaryPrompt
from offpath.compaction.settings import Settings
from offpath.compaction.summarizers.base import (
    EmptySummaryError,
    MalformedSummaryError,
    SummarizerError,
    SummaryResult,
    TransientSummarizerError,
)
from offpath.compaction.summary import strip_instructions, template_problem

log = logging.getLogger("offpath.summarizer")

#: Hard cap on a summary's length in chars, whatever the model writes (~4x the 400 words).
MAX_SUMMARY_CHARS = 10_000


class LLMSummarizer:
    """Summarizes with a chat model (``ChatOpenAI`` in production, any ``BaseChatModel`` in tests)."""

    def __init__(self, model: BaseChatModel, model_name: str) -> None:
        self.model = model
        self.model_name = model_name
        self.name = f"llm:{model_name}"

    @classmethod
    def from_settings(cls, settings: Settings) -> LLMSummarizer:
        """A ``ChatOpenAI`` client from the settings (no network call is made here)."""
        from langchain_openai import ChatOpenAI

        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
        model = ChatOpenAI(
            model=settings.summarization_model,
            api_key=key or "not-needed",  # local OpenAI-compatible servers take any key
            base_url=settings.openai_base_url or None,
            timeout=settings.summarization_timeout_s,
            max_retries=settings.summarization_max_retries,
            max_completion_tokens=settings.summarization_max_output_tokens,
            temperature=0,
        )
        return cls(model, settings.summarization_model)

    def summarize(self, plan: CompactionPlan, prompt: SummaryPrompt) -> SummaryResult:
        """Call the model once (plus the client's retries); raise on error or empty text."""
        try:
            answer = self.model.invoke(
                [SystemMessage(content=prompt.system), HumanMessage(content=prompt.user)]
            )
        # the errors say what failed in offpath's words (they are stored in the job's row and
        # shown by /stats and the UI); the LLM's own text goes to the log (issue 20, item 9)
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
        if not text:
            raise EmptySummaryError("the LLM answered with an empty summary")
        if problem := template_problem(text):
            raise MalformedSummaryError(f"malformed summary: {problem}")
        text, dropped = strip_instructions(text)
        if dropped:
            log.warning("dropped %d line(s) of the summary that read as instructions", dropped)
        if len(text) > MAX_SUMMARY_CHARS:
            text = text[:MAX_SUMMARY_CHARS].rstrip() + "\n[summary cut at 10,000 chars]"
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
