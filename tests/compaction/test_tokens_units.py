"""Issue 22, "Counting tokens": SUMMARIZATION_THRESHOLD_TOKENS (converted to chars once, at
start-up, by CHARS_PER_TOKEN) and the calibration of that ratio from the provider's
``usage_metadata`` (arithmetic in the middleware, no tokenizer on the hot path)."""

from __future__ import annotations

import logging

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

from offpath.compaction.settings import SettingsError
from offpath.compaction.tokens import Calibration, input_tokens, threshold_chars
from offpath.config import load_settings


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


# --- issue 35, item 3: tokens as each thread's model counts them -------------------------------

ZH = "结账服务请求等待数据库连接两千毫秒后失败，连接池已满。" * 40
EN = "checkout request failed after waiting 2000 ms for a db connection, pool full. " * 40


def test_openai_models_name_their_encoding_and_others_none():
    from offpath.compaction.tokens import encoding_for

    assert encoding_for("gpt-4o-mini") == encoding_for("gpt-4.1") == "o200k_base"
    assert encoding_for("o3-mini") == encoding_for("ft:gpt-4o-2024-08-06:acme::x") == "o200k_base"
    assert encoding_for("gpt-4") == encoding_for("gpt-3.5-turbo") == "cl100k_base"
    assert encoding_for("openai/gpt-4o") == "o200k_base"  # a router's name for it
    for other in ("llama3.1:8b", "claude-3-5-sonnet", "qwen2.5", "gpt4all", None, ""):
        assert encoding_for(other) is None, other


def test_the_counter_counts_offline_and_each_message_once():
    from offpath.compaction.tokens import TokenCounter, encoder

    counter = TokenCounter("o200k_base")
    assert counter.exact
    zh, en = HumanMessage(ZH, id="zh"), HumanMessage(EN, id="en")
    n_zh, n_en = counter.count([zh]), counter.count([en])
    assert len(ZH) / n_zh < 2 < 3.5 < len(EN) / n_en  # CJK runs under 2 chars per token
    assert n_zh == len(encoder("o200k_base").encode_ordinary(ZH))
    assert counter.count([zh, en]) == n_zh + n_en and len(counter._cache) == 2


def test_a_thread_at_another_ratio_gets_its_own_sizes_and_a_chars_threshold_is_untouched():
    from offpath.compaction.tokens import for_thread

    s = load_settings(summarization_threshold_tokens=5_000, summarization_keep_chars=6_000)
    assert s.summarization_threshold_chars == 20_000  # CHARS_PER_TOKEN 4
    cjk = for_thread(s, 1.4)
    assert cjk.summarization_threshold_chars == 7_000  # 5,000 tokens at 1.4 chars each
    assert cjk.summarization_keep_chars == 2_100  # 6,000 x 1.4 / 4
    assert cjk.hard_limit_chars == 21_000 and cjk.prepare_floor_chars == int(7_000 * 0.8)
    assert for_thread(s, None) is s and for_thread(s, 4.0).summarization_threshold_chars == 20_000
    chars = load_settings(summarization_threshold_chars=20_000, summarization_keep_chars=6_000)
    assert for_thread(chars, 1.4) is chars  # the threshold in chars: the seed's behaviour


def test_each_thread_has_its_own_ratio_exact_for_openai_measured_for_others():
    """Never one global guess: two threads of one agent at different ratios at once; an
    OpenAI model's counted exactly, another's estimated (o200k_base) until its provider
    has reported three calls, then measured from those reports."""
    from offpath.agent.middleware.counting import ThreadTokens

    tokens = ThreadTokens(default=4.0)
    zh, en = [HumanMessage(ZH, id="zh")], [HumanMessage(EN, id="en")]
    exact_zh = tokens.measure("t-zh", "gpt-4o-mini", zh)
    exact_en = tokens.measure("t-en", "gpt-4o-mini", en)
    assert exact_zh.how == exact_en.how == "exact (o200k_base)"
    assert exact_zh.chars_per_token < 2 < 3.5 < exact_en.chars_per_token
    assert tokens.last("t-zh") == exact_zh and tokens.last("t-en") == exact_en
    first = tokens.measure("t-llama", "llama3.1:8b", zh)
    assert first.how == "estimated (o200k_base)"
    for _ in range(3):  # its provider reports 1,000 tokens for 1,300 chars sent
        tokens.observe("t-llama", 1_300, _ai(1_000))
    measured = tokens.measure("t-llama", "llama3.1:8b", zh)
    assert measured == type(measured)(1.3, "measured")
    assert tokens.measure("t-zh", "gpt-4o-mini", zh) == exact_zh  # reports never mix threads


def test_without_a_tokenizer_the_ratio_falls_back_to_chars_per_token(monkeypatch):
    import sys

    from offpath.agent.middleware.counting import ThreadTokens
    from offpath.compaction.tokens import TokenCounter, encoder

    encoder.cache_clear()
    monkeypatch.setitem(sys.modules, "quicktok", None)  # `import quicktok` fails
    try:
        assert TokenCounter().count([HumanMessage(ZH)]) is None
        ratio = ThreadTokens(default=3.5).measure("t", "gpt-4o", [HumanMessage(ZH, id="z")])
        assert (ratio.chars_per_token, ratio.how) == (3.5, "CHARS_PER_TOKEN")
    finally:
        encoder.cache_clear()


def test_stats_counts_each_compactions_tokens_at_its_threads_ratio(tmp_path):
    """``/stats`` shows tokens beside chars: a compaction's tokens saved are its chars saved
    over its thread's ratio (a CJK thread's 14,000 chars are 10,000 tokens, an English
    thread's 14,000 chars 3,500); a compaction whose job measured none counts chars / 4."""
    from offpath.stores.db.engine import make_engine, migrate
    from offpath.stores.db.tables import JobStatus
    from offpath.stores.db.transitions import create_job, finalize, store_result
    from offpath.stores.usage.stats_body import stats

    settings = load_settings(data_dir=str(tmp_path))
    migrate(settings)
    engine = make_engine(settings)
    for job, ratio in (("zh", 1.4), ("en", 4.0), ("old", None)):
        create_job(engine, job, f"t-{job}", 20_000)
        record = {"messages_removed": 3, "chars_removed": 15_000, "chars_before": 20_000}
        usage = {"latency_ms": 5, "chars_per_token": ratio}
        result = {"record": {**record, "chars_after": 6_000}, "usage": usage}
        store_result(engine, job, result, JobStatus.PREPARED)
        assert finalize(engine, job, f"t-{job}")
    summary = stats(engine)["summary"]
    engine.dispose()
    assert summary["total_chars_compacted"] == 3 * 14_000  # unchanged, the seed's field
    assert summary["approx_tokens_saved"] == 3 * 14_000 // 4
    assert summary["total_tokens_compacted"] == 10_000 + 3_500 + 3_500
    assert summary["tokens_counted_compactions"] == 2
