"""A Celery worker whose offline summarizer takes ``BENCH_SUMMARY_DELAY_S`` seconds per summary
and whose every summarizer waits ``BENCH_EXTRA_DELAY_S`` more (the peak grid,
:mod:`bench.peakgrid`): the offline summarizer answers in milliseconds, an LLM in seconds; the
grid compares both summary sizes at one latency (issue 18: "summary latency 2 s"), and a late
summarizer on top of the stub LLM's own delay (issue 30: 6 s, turns arrive meanwhile).
Bench-only: the product's summarizers are untouched.

``python -m bench.slow_offline -A offpath.worker.celery_app worker ...`` (Celery's own
command line).
"""

from __future__ import annotations

import os
import sys
import time

from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.llm import LLMSummarizer

_summarize = OfflineSummarizer.summarize
_llm_summarize = LLMSummarizer.summarize


def _extra() -> float:
    return float(os.environ.get("BENCH_EXTRA_DELAY_S", "0"))


def _slow(self, plan, prompt):  # type: ignore[no-untyped-def]
    time.sleep(float(os.environ.get("BENCH_SUMMARY_DELAY_S", "0")) + _extra())
    return _summarize(self, plan, prompt)


def _slow_llm(self, plan, prompt):  # type: ignore[no-untyped-def]
    time.sleep(_extra())
    return _llm_summarize(self, plan, prompt)


OfflineSummarizer.summarize = _slow  # type: ignore[method-assign]
LLMSummarizer.summarize = _slow_llm  # type: ignore[method-assign]

if __name__ == "__main__":
    from celery.bin.celery import main

    sys.exit(main())
