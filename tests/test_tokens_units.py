"""Issue 22, "Counting tokens": SUMMARIZATION_THRESHOLD_TOKENS (converted to chars once, at
start-up, by CHARS_PER_TOKEN) and the calibration of that ratio from the provider's
``usage_metadata`` (arithmetic in the middleware, no tokenizer on the hot path)."""

from __future__ import annotations

import logging

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

from offpath.compaction.settings import SettingsError, load_settings
from offpath.compaction.tokens import Calibration, input_tokens, threshold_chars


@pytest.fixture(autouse=True)
def _no_env_file(monkeypatch):
    monkeypatch.setenv("OFFPATH_ENV_FILE", "")
    for name in ("SUMMARIZATION_THRESHOLD_CHARS", "SUMMARIZATION_THRESHOLD_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("CHARS_PER_TOKEN", raising=False)


def _ai(tokens: int | None) -> AIMessage:
    usage = (
        {"input_tokens": tokens, "output_tokens": 1, "total_tokens": tokens + 1}
        if tokens is not None
        else None
    )
    return AIMessage("ok", usage_metadata=usage)


def test_threshold_tokens_become_chars_at_the_set_ratio(monkeypatch):
    monkeypatch.setenv("SUMMARIZATION_THRESHOLD_TOKENS", "15000")
    monkeypatch.setenv("CHARS_PER_TOKEN", "3.5")
    s = load_settings()
    assert s.summarization_threshold_chars == 52_500
    assert s.hard_limit_chars == 3 * 52_500  # everything derived from the threshold follows


def test_threshold_tokens_default_ratio_is_four():
    assert load_settings(summarization_threshold_tokens=20_000).summarization_threshold_chars == (
        80_000
    )
    assert load_settings().summarization_threshold_chars == 60_000  # unset: the chars setting


def test_threshold_tokens_and_chars_both_set_fail_naming_both():
    with pytest.raises(SettingsError) as err:
        load_settings(summarization_threshold_tokens=10_000, summarization_threshold_chars=40_000)
    assert "SUMMARIZATION_THRESHOLD_TOKENS" in str(err.value)
    assert "SUMMARIZATION_THRESHOLD_CHARS" in str(err.value)


def test_converted_threshold_is_checked_against_keep():
    with pytest.raises(SettingsError, match="SUMMARIZATION_KEEP_CHARS"):
        load_settings(summarization_threshold_tokens=4_000)  # 16,000 chars < keep 20,000


def test_chars_per_token_bounds():
    with pytest.raises(SettingsError, match="CHARS_PER_TOKEN"):
        load_settings(chars_per_token=0.5)
    assert threshold_chars(1_000, 3.26) == 3_260


def test_input_tokens_reads_usage_metadata_only_when_reported():
    assert input_tokens(_ai(1_234)) == 1_234
    assert input_tokens(_ai(None)) is None
    assert input_tokens(_ai(0)) is None
    assert input_tokens(HumanMessage("no usage")) is None


def test_calibration_is_total_chars_over_total_tokens_after_min_calls():
    c = Calibration(default=4.0, min_calls=2)
    assert c.observe(3_000, _ai(1_000))
    assert not c.calibrated and c.chars_per_token == 4.0  # one call: the default
    assert not c.observe(5_000, _ai(None))  # no usage: not counted
    assert not c.observe(0, _ai(10))  # nothing sent: not counted
    assert c.observe(9_000, _ai(2_000))
    assert c.calibrated and c.calls == 2
    assert c.chars_per_token == pytest.approx(12_000 / 3_000)
    c.observe(1_000, _ai(1_000))  # weighted by size, not a mean of ratios
    assert c.chars_per_token == pytest.approx(13_000 / 4_000)
    assert c.to_chars(10_000) == 32_500


def test_middleware_calibrates_from_the_models_usage_and_says_the_ratio(caplog):
    from offpath import OffPathCompaction

    settings = load_settings(summarization_threshold_chars=0)  # inactive: no client needed
    mw = OffPathCompaction(settings, recall=False)
    mw.calibration = Calibration(default=settings.chars_per_token, min_calls=1)
    question = "x" * 3_000
    model = GenericFakeChatModel(messages=iter([_ai(1_000)]))
    agent = create_agent(model, [], middleware=[mw])
    with caplog.at_level(logging.WARNING, logger="offpath.middleware"):
        agent.invoke({"messages": [HumanMessage(question)]})
    assert (mw.calibration.calls, mw.calibration.chars, mw.calibration.tokens) == (1, 3_000, 1_000)
    assert mw.calibration.chars_per_token == 3.0
    assert any("3.00 chars per input token" in r.getMessage() for r in caplog.records)
