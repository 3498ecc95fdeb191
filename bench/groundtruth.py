"""Benchmark 14, fidelity by ground truth we did not choose (issue 19): tau-bench's runs,
compacted by offpath and by LangChain's ``SummarizationMiddleware``, and the facts the task's
ground-truth actions need, still visible to the model or found by ``recall``.

Data: sierra-research/tau-bench (MIT), ``historical_trajectories/gpt-4o-airline.json`` (and
``gpt-4o-retail.json`` when present), read from the directory named by ``TAU_BENCH_DIR`` (a
checkout of the repository, or a directory holding those files). Nothing of it is in this
repository. When the variable is unset or holds neither file, this benchmark says so and
measures nothing (the report names the files that ran).

The facts are chosen by the task, not by offpath's extractor: the leaf values of each run's
ground-truth actions (``info.task.actions[].kwargs``) under an argument named like an
identifier (its name ends in ``id``, ``ids``, ``number``, ``date``, ``dob`` or ``zip``:
reservation, user, payment, order and item ids, flight numbers, dates), at least 4 chars,
that appear in the run's conversation. Amounts, names, cabins and other enumerations are not
counted.

Each run's messages (OpenAI format, the system prompt left out: an agent's system prompt is
not in its thread's state, and offpath never touches it) are converted with
:func:`offpath.compaction.formats.to_messages` and replayed message by message. Before each
assistant message (a model call), the compactor under test runs on the thread:

* offpath: tool results that arrived since the last call over ``TOOL_RESULT_MAX_CHARS`` are
  shortened (:func:`offpath.compaction.shorten.arrival_caps`, originals archived), then, over
  the threshold, one compaction end to end (:func:`offpath.compaction.pipeline.compact`:
  plan, prompt, summarizer, fact guard, fit), its originals archived in a real SQLite usage
  database; the summary is ready when it is needed (the best case of the background job);
* LangChain: ``SummarizationMiddleware.before_model`` with ``trigger=("tokens", threshold/4)``,
  ``keep=("tokens", keep/4)``, a chars / 4 token counter and no trimming (as benchmark 8).

Summarizers: ``offline`` (offpath's offline summarizer behind the fact guard, as
``make_summarizer`` builds it with no LLM) and ``stub`` (an LLM-shaped stub that names nothing:
the seed's template padded with generic findings to the summary's text budget, two thirds of
``SUMMARY_MAX_SHARE`` x the threshold; behind the fact guard for offpath, as
``make_summarizer`` builds an LLM summarizer). LangChain's middleware runs with the same stub.

Measured per configuration (threshold / keep, summarizer):

* **visible**: of the facts of runs whose thread outgrows the threshold (the same runs for
  every compactor of a threshold), the share visible to the model (its summary, pinned facts,
  kept or shortened messages) at every model call from their first mention on;
* **compacted away**: facts that at some model call were in no original message of the thread
  (every mention removed or shortened out), and the share of those still visible then;
* **recall**: of the facts compacted away, the share that ``recall(<the fact>)`` finds among
  its first three excerpts at the end of the run (offpath only; the middleware keeps no
  archive).

Targets (issue 19): >= 95% visible and 100% by recall, with each summarizer; with the same
stub, offpath >= 30 points above LangChain's middleware.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import Context, Result
from bench.compacting import (
    Archive,
    OffpathCompactor,
    data_dir,
    is_summary_message,
    names_nothing,
    recall_hits,
    stub_summarizer,
    verbatim,
    view,
)

NAME = "groundtruth"
ENV = "TAU_BENCH_DIR"
FILES = ("gpt-4o-airline.json", "gpt-4o-retail.json")
#: (threshold, keep) in chars, from issue 19.
CONFIGS = ((8_000, 3_000), (4_000, 1_500))
QUICK_RUNS = 25
VISIBLE_TARGET = 0.95
RECALL_TARGET = 1.0
LEAD_POINTS = 30.0
#: An action argument whose value is a fact: an identifier, a flight number, a date.
FACT_KEY = re.compile(r"(?:^|_)(?:id|ids|number|date|dob|zip)$")
MIN_FACT_CHARS = 4
RECALL_TOP = 3


@dataclass
class Tally:
    """One configuration's counts over the runs."""

    runs: int = 0
    long_runs: int = 0
    compacted_runs: int = 0
    compactions: int = 0
    facts: int = 0  # facts of long runs (the visible share's denominator)
    visible: int = 0
    away: int = 0  # compacted away at some model call
    away_visible: int = 0
    recalled: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    lost_by_kind: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)

    def share(self, part: int, whole: int) -> float:
        return part / whole if whole else 1.0


def load_runs(where: Path, quick: bool) -> list[tuple[str, dict[str, Any]]]:
    """``(label, run)`` for every run of the files present (the first :data:`QUICK_RUNS` of
    each with ``quick``)."""
    out = []
    for name in FILES:
        path = where / name
        if not path.is_file():
            continue
        runs = json.loads(path.read_text())
        for k, run in enumerate(runs[:QUICK_RUNS] if quick else runs):
            out.append((f"{path.stem}#{k}", run))
    return out


def facts_of(run: dict[str, Any]) -> dict[str, str]:
    """The run's ground-truth facts: value -> the argument it came from."""
    found: dict[str, str] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, str(k))
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and FACT_KEY.search(key) and len(value) >= MIN_FACT_CHARS:
            found.setdefault(value, key)

    for action in (run.get("info") or {}).get("task", {}).get("actions") or []:
        walk(action.get("kwargs") or {}, "")
    return found


def conversation(run: dict[str, Any]) -> list[Any]:
    """The run's messages but its system prompt, as LangChain messages with ids."""
    from langgraph.graph.message import add_messages

    from offpath.compaction.formats import to_messages

    items = [m for m in run.get("traj") or [] if m.get("role") != "system"]
    return add_messages([], to_messages(items))


class LangChain:
    """LangChain's ``SummarizationMiddleware`` at each model call, configured as benchmark 8
    configures it."""

    def __init__(self, settings: Any, model: Any) -> None:
        from langchain.agents.middleware import SummarizationMiddleware

        from offpath.compaction.accounting import total_chars

        self.middleware = SummarizationMiddleware(
            model,
            trigger=("tokens", settings.summarization_threshold_chars // 4),
            keep=("tokens", settings.summarization_keep_chars // 4),
            token_counter=lambda messages: total_chars(list(messages)) // 4,
            trim_tokens_to_summarize=None,
        )

    def before_model(self, session: str, thread: list[Any]) -> tuple[list[Any], bool | None]:
        """The thread after the middleware's step, and True when it summarized."""
        from langgraph.graph.message import add_messages

        update = self.middleware.before_model({"messages": thread}, None)  # type: ignore[arg-type]
        if not update:
            return thread, None
        return add_messages(thread, update["messages"]), True


def lost_entry(
    label: str, value: str, key: str, posted: list[Any], thread: list[Any], at: int
) -> str:
    """What :data:`DUMP` writes of a fact out of view: the run, the fact and its argument,
    the message that first held it (its type, a tool result's tool), the model call it was
    first out of view at, and the summary in view then (what it held instead)."""
    first = next((m for m in posted if value in view([m])), None)
    source = "?" if first is None else first.type
    if first is not None and first.type == "tool":
        source += f" {first.name}"
    summary = next((m for m in thread if is_summary_message(m)), None)
    held = "(no summary)" if summary is None else str(summary.content)
    return f"=== {label} {value!r} ({key}) first in {source}; out of view at message {at}\n" + (
        "    " + held.replace("\n", "\n    ") + "\n"
    )


#: A directory: each configuration's facts not visible are written there, one entry each
#: (:func:`lost_entry`), to look into.
DUMP = os.environ.get("GROUNDTRUTH_DUMP")


def replay(
    label: str,
    run: dict[str, Any],
    compactor: Any,
    threshold: int,
    tally: Tally,
    engine: Any,
    dump: list[str] | None = None,
) -> None:
    """Replay ``run`` through ``compactor`` (see the module doc) and count its facts;
    ``dump``: where to add an entry for each fact out of view (:func:`lost_entry`)."""
    from langgraph.graph.message import add_messages

    from offpath.agent import recall
    from offpath.compaction.accounting import total_chars

    posted = conversation(run)
    facts = facts_of(run)
    full = view(posted)
    facts = {v: k for v, k in facts.items() if v in full}
    tally.runs += 1
    long_run = total_chars(posted) > threshold
    session = f"{label}:{id(compactor)}"
    thread: list[Any] = []
    said = ""  # the conversation's text so far
    lost: set[str] = set()
    away: set[str] = set()
    compactions = 0
    for i in range(len(posted) + 1):
        last = i == len(posted)
        if last or (posted[i].type == "ai" and thread):
            thread, done = compactor.before_model(session, thread)
            compactions += done is not None
            shown, original = view(thread), verbatim(thread)
            for value in facts:
                if value in said and value not in original:
                    away.add(value)
                    if value not in shown:
                        if dump is not None and value not in lost:
                            dump.append(lost_entry(label, value, facts[value], posted, thread, i))
                        lost.add(value)
        if not last:
            thread = add_messages(thread, [posted[i]])
            said += "\n" + view([posted[i]])
    tally.compactions += compactions
    tally.compacted_runs += compactions > 0
    if long_run:
        tally.long_runs += 1
        tally.facts += len(facts)
        tally.visible += len(facts) - len(lost)
        for value, kind in facts.items():
            tally.by_kind[kind] += 1
            tally.lost_by_kind[kind] += value in lost
    tally.away += len(away)
    tally.away_visible += len(away - lost)
    tally.lost += [f"{label}: {v}" for v in sorted(lost)]
    if engine is not None:
        for value in away:
            hits = recall_hits(recall.answer(engine, session, value))[:RECALL_TOP]
            tally.recalled += any(value in h for h in hits)


def run(ctx: Context | None = None) -> Result:
    from offpath.compaction.planner import summary_budget_chars
    from offpath.compaction.summary import text_cap
    from offpath.config import load_settings
    from offpath.llm import make_summarizer

    quick = bool(ctx and ctx.quick)
    where, found = data_dir(ENV, FILES)
    title = "14. Fidelity by ground truth (tau-bench)"
    target = (
        ">= 95% of the ground-truth facts visible after compaction and 100% by recall (first "
        "three excerpts), with each summarizer; >= 30 points above SummarizationMiddleware "
        "with the same stub"
    )
    if where is None:
        return Result(
            title,
            target,
            f"not measured: {found} (set {ENV} to a tau-bench checkout)",
            None,
            [
                f"{found}: no tau-bench data, nothing measured; fetch sierra-research/tau-bench "
                f"and set {ENV} to it (historical_trajectories/{FILES[0]})"
            ],
        )
    runs = load_runs(where, quick)
    files = sorted({label.split("#")[0] for label, _ in runs})
    rows: list[tuple[int, int, str, Tally]] = []
    archive = Archive()
    try:
        for threshold, keep in CONFIGS:
            settings = load_settings(
                summarization_threshold_chars=threshold, summarization_keep_chars=keep
            )
            stub_chars = text_cap(summary_budget_chars(settings)) or 0
            compactors = {
                "offpath, offline": lambda s=settings: OffpathCompactor(
                    s, make_summarizer(s), archive
                ),
                "offpath, stub": lambda s=settings, c=stub_chars: OffpathCompactor(
                    s, stub_summarizer(s, c), archive
                ),
                "SummarizationMiddleware, stub": lambda s=settings, c=stub_chars: LangChain(
                    s, names_nothing(c)
                ),
            }
            for name, make in compactors.items():
                tally = Tally()
                engine = archive.engine if name.startswith("offpath") else None
                dump: list[str] | None = [] if DUMP else None
                for label, doc in runs:
                    replay(label, doc, make(), threshold, tally, engine, dump)
                if DUMP and dump is not None:
                    where_to = Path(DUMP) / f"{threshold}-{name.replace(', ', '-')}-lost.txt"
                    where_to.write_text("".join(dump))
                rows.append((threshold, keep, name, tally))
                print(
                    f"bench: {NAME}: {threshold}/{keep} {name}: visible "
                    f"{tally.share(tally.visible, tally.facts):.1%}",
                    flush=True,
                )
    finally:
        archive.close()
    return report(title, target, rows, files, found, quick)


def report(
    title: str,
    target: str,
    rows: list[tuple[int, int, str, Tally]],
    files: list[str],
    found: str,
    quick: bool,
) -> Result:
    table = [
        "| threshold / keep | compactor, summarizer | runs compacted | compactions | facts "
        "(long runs) | visible | compacted away | visible of those | recall, first three |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    shares: dict[tuple[int, str], float] = {}
    met = True
    measured = []
    for threshold, keep, name, t in rows:
        vis = t.share(t.visible, t.facts)
        shares[(threshold, name)] = vis
        offpath = name.startswith("offpath")
        rec = f"{t.recalled}/{t.away} ({t.share(t.recalled, t.away):.1%})" if offpath else "-"
        table.append(
            f"| {threshold:,} / {keep:,} | {name} | {t.compacted_runs}/{t.runs} | "
            f"{t.compactions} | {t.facts} | {t.visible}/{t.facts} ({vis:.1%}) | {t.away} | "
            f"{t.away_visible}/{t.away} ({t.share(t.away_visible, t.away):.1%}) | {rec} |"
        )
        if offpath:
            met = met and vis >= VISIBLE_TARGET and t.share(t.recalled, t.away) >= RECALL_TARGET
    leads = []
    for threshold, _ in CONFIGS:
        ours = shares.get((threshold, "offpath, stub"))
        theirs = shares.get((threshold, "SummarizationMiddleware, stub"))
        if ours is not None and theirs is not None:
            lead = 100 * (ours - theirs)
            leads.append(f"{threshold:,}: {lead:+.1f} points")
            met = met and lead >= LEAD_POINTS
    for threshold, _, name, t in rows:
        if name.startswith("offpath"):
            measured.append(
                f"{threshold:,} {name.split(', ')[1]} {t.share(t.visible, t.facts):.1%} visible, "
                f"recall {t.share(t.recalled, t.away):.1%}"
            )
    kinds = sorted({k for *_, t in rows for k in t.by_kind})
    kind_table = [
        "",
        "| threshold | compactor, summarizer | " + " | ".join(f"{k} visible" for k in kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    for threshold, _, name, t in rows:
        cells = [
            f"{t.by_kind[k] - t.lost_by_kind[k]}/{t.by_kind[k]}" if t.by_kind[k] else "-"
            for k in kinds
        ]
        kind_table.append(f"| {threshold:,} | {name} | " + " | ".join(cells) + " |")
    lost = [
        f"{threshold:,} {name}: not visible at some model call: {', '.join(t.lost[:5])}"
        for threshold, _, name, t in rows
        if t.lost and name.startswith("offpath")
    ]
    return Result(
        title,
        target,
        "; ".join(measured) + f"; offpath over SummarizationMiddleware, same stub: "
        f"{', '.join(leads)}" + (" (--quick: a subset)" if quick else ""),
        met,
        [
            f"data: {', '.join(files)} from {found}"
            + (f" (first {QUICK_RUNS} runs of each, --quick)" if quick else "")
            + "; files not present are not measured",
            "facts: the leaf values of each run's ground-truth actions under arguments named "
            "like identifiers (*id, *ids, *number, *date, dob, zip; >= 4 chars) that appear in "
            "its conversation; chosen by the task, not by offpath's extractor",
            "replayed message by message, the system prompt left out; before each assistant "
            "message the compactor runs (offpath: results over TOOL_RESULT_MAX_CHARS shortened "
            "as they arrive, then a compaction end to end when over the threshold, the summary "
            "ready at once; LangChain: SummarizationMiddleware.before_model, trigger and keep "
            "at threshold / 4 and keep / 4 tokens, chars / 4 counter, no trimming)",
            "stub: an LLM-shaped summary that names nothing (the seed's template padded with "
            "generic findings to two thirds of SUMMARY_MAX_SHARE x the threshold), the same "
            "answers for offpath's LLMSummarizer (behind the fact guard) and for "
            "SummarizationMiddleware",
            "visible: the fact is in the thread the model reads (summary, pinned facts, kept or "
            "shortened messages) at every model call from its first mention on; counted over "
            "the runs whose thread outgrows the threshold (the same runs for each compactor)",
            "compacted away: at some model call, no original message held the fact (every "
            "mention removed or shortened out); recall: recall.answer(<the fact>) at the end "
            "of the run, the fact in one of its first three excerpts",
            *lost[:6],
        ],
        "the fact guard pins at most what the summary's budget (SUMMARY_MAX_SHARE x the "
        "threshold, less the summarizer's text) leaves; ids that recur in every result "
        "compete with the task's own",
        table + kind_table,
    )
