"""A Celery worker whose offline summarizer takes ``BENCH_SUMMARY_DELAY_S`` seconds per summary
(the peak grid, :mod:`bench.peakgrid`): the offline summarizer answers in milliseconds, an LLM
in seconds; the grid compares both summary sizes at one latency (issue 18: "summary latency
2 s"). Bench-only: the product's summarizer is untouched.

``python -m bench.slow_offline -A offpath.worker.celery_app worker ...`` (Celery's own
command line).
"""

from __future__ import annotations

import os
import sys
import time

from offpath.compaction.summarizers.offline import OfflineSummarizer

_summarize = OfflineSummarizer.summarize


def _slow(self, plan, prompt):  # type: ignore[no-untyped-def]
    time.sleep(float(os.environ.get("BENCH_SUMMARY_DELAY_S", "0")))
    return _summarize(self, plan, prompt)


OfflineSummarizer.summarize = _slow  # type: ignore[method-assign]

if __name__ == "__main__":
    from celery.bin.celery import main

    sys.exit(main())
