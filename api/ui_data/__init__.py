"""What the web UI's pages show (:mod:`api.ui`), read in-process from the service layer.

Every function takes the runtime and the caller (a :class:`~offpath.stores.tenants.Principal`)
and returns plain dicts and lists for the Jinja2 templates; nothing here renders HTML.
A non-admin caller sees only the sessions its tenant owns, as in the JSON API.

* :mod:`.dashboard`: :func:`dashboard_stats`, the ``/stats`` body
  (:func:`offpath.stores.usage.stats`, as the route computes it; its ``recent_failures``
  too) and its widgets, each tagged with its JSON path in that body;
* :mod:`.chart`: :func:`size_chart`, thread size over time for the busiest sessions, as SVG
  coordinates;
* :mod:`.listing`: :func:`session_page`, a page of the sessions list (``GET /sessions``'s
  :func:`offpath.stores.usage.list_sessions`);
* :mod:`.thread`: :func:`thread_items` / :func:`originals_by_summary`, one session's thread
  as the model sees it, and the archived originals each summary replaced; its fixed part
  (:func:`fixed_part_of`).
"""

from .chart import (
    CHART_H,
    CHART_SESSIONS,
    CHART_W,
    COLORS,
    PAD_B,
    PAD_L,
    PAD_R,
    PAD_T,
    Series,
    busiest_sessions,
    nice_ticks,
    size_chart,
    size_series,
    steps_of,
    summary_chars,
    tick_label,
)
from .dashboard import (
    FOLDED,
    SESSION_WIDGETS,
    TONES,
    WIDGETS,
    dashboard_stats,
    flatten,
    fmt,
    fmt_ms,
    is_duration,
    label_of,
    session_widgets,
    shown,
    tone_of,
    widget,
    widgets,
)
from .listing import PAGE_SIZE, SORTS, activity_of, session_counts, session_page, thread_of
from .thread import (
    MAX_ORIGINALS,
    fixed_part_of,
    job_timeline,
    originals_by_summary,
    originals_totals,
    own_summaries,
    session_version,
    thread_items,
    tokens_of,
    waiting_job,
)

__all__ = [
    "CHART_H",
    "CHART_SESSIONS",
    "CHART_W",
    "COLORS",
    "PAD_B",
    "PAD_L",
    "PAD_R",
    "PAD_T",
    "Series",
    "busiest_sessions",
    "nice_ticks",
    "size_chart",
    "size_series",
    "steps_of",
    "summary_chars",
    "tick_label",
    "FOLDED",
    "SESSION_WIDGETS",
    "TONES",
    "WIDGETS",
    "dashboard_stats",
    "flatten",
    "fmt",
    "fmt_ms",
    "is_duration",
    "label_of",
    "session_widgets",
    "shown",
    "tone_of",
    "widget",
    "widgets",
    "PAGE_SIZE",
    "SORTS",
    "activity_of",
    "session_counts",
    "session_page",
    "thread_of",
    "MAX_ORIGINALS",
    "fixed_part_of",
    "job_timeline",
    "originals_by_summary",
    "originals_totals",
    "own_summaries",
    "session_version",
    "thread_items",
    "tokens_of",
    "waiting_job",
]
