"""Recognising a provider's context-length refusal (``offpath.agent.middleware.refusals``):
LangChain's own ``ContextOverflowError``, and the raw shapes of providers and servers whose
integration does not convert them, wherever in the chain of exceptions they are; never a rate
limit or another bad request. Over real HTTP with ``ChatOpenAI``:
``tests/integration/test_context_refusal.py``."""

from __future__ import annotations

import httpx
import openai
import pytest
from langchain_core.exceptions import ContextOverflowError

from offpath.agent.middleware.refusals import ContextRefused, Refusal, context_refusal

URL = "http://127.0.0.1:9/v1/chat/completions"


def openai_error(status: int, body: dict) -> openai.APIStatusError:
    """The error the ``openai`` SDK raises for an answer of ``status`` with ``body``, raw (as
    an integration that does not convert it lets it through)."""
    response = httpx.Response(status, json=body, request=httpx.Request("POST", URL))
    client = openai.OpenAI(api_key="k", base_url=URL.rsplit("/", 2)[0])
    return client._make_status_error_from_response(response)


OPENAI = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your "
        "messages resulted in 131,072 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
ANTHROPIC = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 210000 tokens > 200000 maximum",
    },
}
GEMINI = {
    "error": {
        "code": 400,
        "message": "The input token count (1200000) exceeds the maximum number of tokens "
        "allowed (1048576).",
        "status": "INVALID_ARGUMENT",
    }
}


def test_openai_shape_raw_is_a_refusal_with_its_numbers():
    error = openai_error(400, OPENAI)
    assert not isinstance(error, ContextOverflowError)  # raw: not converted
    refusal = context_refusal(error)
    assert refusal == Refusal(refusal.words, 128_000, 131_072)
    assert "maximum context length" in refusal.words


def test_anthropic_shape_raw_is_a_refusal_with_its_numbers():
    refusal = context_refusal(openai_error(400, ANTHROPIC))
    assert refusal is not None
    assert (refusal.limit_tokens, refusal.sent_tokens) == (200_000, 210_000)


def test_a_raw_http_error_is_read_from_its_response_body():
    response = httpx.Response(400, json=GEMINI, request=httpx.Request("POST", URL))
    error = httpx.HTTPStatusError("400 Bad Request", request=response.request, response=response)
    refusal = context_refusal(error)
    assert refusal is not None
    assert (refusal.limit_tokens, refusal.sent_tokens) == (1_048_576, 1_200_000)


@pytest.mark.parametrize(
    "text",
    [
        "An error occurred (ValidationException): Input is too long for requested model.",
        "litellm.ContextWindowExceededError: litellm.BadRequestError: context window exceeded",
        "request (9000 tokens) exceeds the available context size (8192 tokens)",
        "Your input exceeds the context window of this model.",
    ],
)
def test_wordings_of_other_providers_are_refusals(text):
    assert context_refusal(RuntimeError(text)) is not None


def test_the_library_exception_and_a_refusal_raised_from_are_refusals():
    assert context_refusal(ContextOverflowError("too long")) is not None
    try:
        try:
            raise openai_error(400, OPENAI)
        except openai.BadRequestError as inner:
            raise RuntimeError("the model call failed") from inner
    except RuntimeError as outer:
        wrapped = outer
    refusal = context_refusal(wrapped)
    assert refusal is not None and refusal.limit_tokens == 128_000
    assert issubclass(ContextRefused, ContextOverflowError)  # apps catching it catch ours


@pytest.mark.parametrize(
    ("status", "body"),
    [
        # a rate limit that speaks of tokens is not a refusal
        (
            429,
            {
                "error": {
                    "message": "Rate limit reached for gpt-4o on tokens per min (TPM): Limit "
                    "30000, Requested 131072. Please reduce the length of the messages.",
                    "type": "tokens",
                    "code": "rate_limit_exceeded",
                }
            },
        ),
        (400, {"error": {"message": "Invalid model name", "type": "invalid_request_error"}}),
        (500, {"error": {"message": "maximum context length is unknown", "type": "server"}}),
    ],
)
def test_other_errors_are_not_refusals(status, body):
    assert context_refusal(openai_error(status, body)) is None


def test_the_retry_aims_under_the_named_window():
    refusal = Refusal("x", limit_tokens=100_000, sent_tokens=125_000)
    assert refusal.allowed(50_000) == int(50_000 * 0.8 * 0.85)
    assert Refusal("x").allowed(50_000) is None
