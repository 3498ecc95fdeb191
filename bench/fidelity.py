"""Benchmark 10, summary fidelity (issue 11, item 5): the share of marked facts still in the
thread after compaction, and a probe harness, for three summarizers.

Each case of ``../shared/cases`` with messages and each transcript of
``../shared/transcripts`` is replayed turn by turn through the real compaction
pipeline (planner, prompt, summarizer, fact guard, patch): whenever the thread is
over its threshold (the case's settings, else the defaults), it is compacted, and
the removed originals go to a real SQLite archive.

Marked facts, fixed before any compaction and independently of the guard's output:

* a case's ``expect.facts_for_fidelity`` strings;
* in a transcript, the facts the extractor marks as stated by the agent
  (:func:`offpath.compaction.facts.stated_facts`: its own text and tool-call
  arguments).

A fact is kept when its text is in the final thread (any message, the summary
included). Only facts that were compacted away count (those still in kept
messages are kept trivially). Target: >= 95% with each summarizer:

* ``offline``: the offline summarizer;
* ``generic``: a stub LLM (LangChain's fake chat model, through the real LLM
  summarizer) that answers with a summary naming no specifics: the guard must lift it;
* ``llm``: the configured LLM (``OPENAI_API_KEY`` / ``OPENAI_BASE_URL``), if any.

The probe harness asks, per thread, questions about removed details and judges by
exact match (no LLM judge is configured here):

* recall: "what was the error code at <line's identifier>?": the code;
* artifact: "which files were changed?": the paths of the agent's editing tool calls;
* continuation: "what was the last step before the summary?": the last tool call's name.

Each is answered from the compacted thread (plus, for recall questions, what the
``recall`` tool answers for the question's subject: the archive's full-text search)
and from the full thread.
"""

from __future__ import annotations

import itertools
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.common import Context, Result

NAME = "fidelity"
SHARED = Path(__file__).resolve().parents[2] / "shared"
TARGET = 0.95
GENERIC = (
    "**Investigating:** the reported problem.\n**Key findings:**\n- several errors were seen "
    "in the logs\n- some services were affected\n**Ruled out:**\n- nothing yet\n"
    "**Current state:** the investigation continues."
)
#: The generic stub without the guard: not judged, it shows what the guard lifts.
BASELINE = "generic, no guard"
_EDIT = re.compile(r"\b(sed -i|apply_patch|str_replace|create|write_file|edit|patch)\b", re.I)


@dataclass
class Tally:
    marked: int = 0
    kept: int = 0
    compactions: int = 0
    lost: list[str] = field(default_factory=list)
    probes: dict[str, list[int]] = field(default_factory=dict)  # kind -> [asked, compacted, full]

    @property
    def share(self) -> float:
        return self.kept / self.marked if self.marked else 1.0


def documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted((SHARED / "cases").glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("messages"):
            docs.append((f"case {path.stem}", doc))
    for path in sorted((SHARED / "transcripts").glob("*.json")):
        docs.append((f"transcript {path.stem}", json.loads(path.read_text())))
    return docs


def summarizers() -> dict[str, Any]:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from offpath.compaction.summarizers.offline import OfflineSummarizer
    from offpath.config import get_settings
    from offpath.llm import LLMSummarizer

    out: dict[str, Any] = {
        "offline": OfflineSummarizer(),
        "generic": LLMSummarizer(
            GenericFakeChatModel(messages=itertools.repeat(AIMessage(GENERIC))), "generic-stub"
        ),
    }
    settings = get_settings()
    if settings.llm_configured:
        out["llm"] = LLMSummarizer.from_settings(settings)
    return out


def replay(name: str, doc: dict[str, Any], inner: Any, engine: Any, guard: bool = True) -> Tally:
    """``doc`` replayed through compaction with ``inner`` behind the fact guard (``guard``
    False: without it, the baseline that shows what the guard lifts)."""
    from langgraph.graph.message import add_messages

    from offpath.agent import recall
    from offpath.compaction.facts.extraction import stated_facts
    from offpath.compaction.formats import split_turns, to_messages
    from offpath.compaction.pipeline import Skip, compact
    from offpath.compaction.summarizers.guarded import GuardedSummarizer
    from offpath.compaction.summary import is_summary
    from offpath.config import load_settings
    from offpath.stores import archive
    from offpath.stores.db.tables import JOBS
    from offpath.stores.db.transitions import create_job

    overrides = {k.lower(): v for k, v in (doc.get("settings") or {}).items()}
    settings = load_settings(**overrides)
    summarizer = GuardedSummarizer(inner, settings.summary_pinned_max_chars if guard else 0)
    posted = add_messages([], to_messages(doc["messages"]))  # ids for those without
    marked = list((doc.get("expect") or {}).get("facts_for_fidelity") or [])
    if not marked:
        marked = [f.value for f in stated_facts(posted)]
    thread: list[Any] = []
    tally = Tally()
    session = f"{name}-{inner.name}-{guard}"
    removed_ids: set[str] = set()
    last_call = ""
    for turn in split_turns(posted):
        thread = add_messages(thread, turn)
        done = compact(thread, settings, summarizer)  # after each turn, as the hook does
        if not isinstance(done, Skip):
            job = f"j{tally.compactions}-{session}"
            removed = set(done.fitted.removed)
            rows = archive.rows_for(session, job, str(done.summary.id), thread, done.fitted.removed)
            create_job(engine, job, session, None)
            archive.store_record(engine, job, {}, rows)
            with engine.begin() as conn:
                conn.execute(sa.update(JOBS).where(JOBS.c.job_id == job).values(status="applied"))
            for m in thread:
                if str(m.id) in removed:
                    removed_ids.add(str(m.id))
                    for c in getattr(m, "tool_calls", None) or []:
                        last_call = str(c.get("name"))
            thread = add_messages(thread, done.patch)
            tally.compactions += 1
    final = "\n".join(text_of(m) for m in thread)
    if not tally.compactions:
        return tally
    verbatim = "\n".join(text_of(m) for m in thread if not is_summary(m))
    for fact in (f for f in marked if f not in verbatim):  # compacted away
        tally.marked += 1
        if fact in final:
            tally.kept += 1
        else:
            tally.lost.append(fact)
    _probes(tally, posted, removed_ids, final, session, engine, last_call, recall)
    return tally


def _probes(
    tally: Tally,
    posted: list[Any],
    removed_ids: set[str],
    final: str,
    session: str,
    engine: Any,
    last_call: str,
    recall: Any,
) -> None:
    """Ask the probe questions; a question is answered when its expected answer is in the
    thread (or the recall answer for its key words)."""
    from offpath.compaction.facts.patterns import find
    from offpath.compaction.prompt import render_content

    full = "\n".join(text_of(m) for m in posted)
    removed = [m for m in posted if str(m.id) in removed_ids]
    questions: list[tuple[str, str, str]] = []  # kind, subject to recall, expected answer
    for m in removed:
        for line in render_content(m.content).splitlines():
            facts = find(line)
            codes = [v for v, k, _ in facts if k == "error_code"]
            names = [v for v, k, _ in facts if k == "identifier"]
            if codes and names:
                questions.append(("recall", names[0], codes[0]))
                break
    edits = []
    for m in removed:
        for c in getattr(m, "tool_calls", None) or []:
            args = json.dumps(c.get("args") or {})
            if _EDIT.search(args) or _EDIT.search(str(c.get("name"))):
                edits += [v for v, k, _ in find(args) if k == "path"]
    for path in dict.fromkeys(edits):
        questions.append(("artifact", "", path))  # "which files were changed?"
    if last_call:
        questions.append(("continuation", "", last_call))  # "what was the last step?"
    seen: set[tuple[str, str]] = set()
    for kind, words, expected in questions[:20]:
        if (kind, expected) in seen:
            continue
        seen.add((kind, expected))
        asked = tally.probes.setdefault(kind, [0, 0, 0])
        asked[0] += 1
        # recall is asked with the question's subject only, never with the answer
        answer = final + ("\n" + recall.answer(engine, session, words) if words else "")
        asked[1] += expected in answer
        asked[2] += expected in full


def text_of(message: Any) -> str:
    """What the model reads of a message: its text and its tool calls with their arguments."""
    from offpath.compaction.prompt import render_content

    calls = [
        f"{c.get('name')}({json.dumps(c.get('args') or {}, ensure_ascii=False, default=str)})"
        for c in getattr(message, "tool_calls", None) or []
    ]
    return "\n".join([render_content(message.content), *calls])


def run(ctx: Context | None = None) -> Result:
    from offpath.config import load_settings
    from offpath.stores.db.engine import make_engine, migrate

    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(data_dir=tmp)
        migrate(settings)
        engine = make_engine(settings)
        tallies: dict[str, dict[str, Tally]] = {}
        chosen = summarizers()
        runs = [(label, inner, True) for label, inner in chosen.items()]
        runs.append((BASELINE, chosen["generic"], False))
        for label, inner, guard in runs:
            tallies[label] = {
                name: replay(name.split()[-1], doc, inner, engine, guard)
                for name, doc in documents()
            }
        engine.dispose()
    labels = list(tallies)
    table = [
        "| thread | compactions | " + " | ".join(f"{lb} kept" for lb in labels) + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    names = list(next(iter(tallies.values())))
    for name in names:
        cells = []
        for lb in labels:
            t = tallies[lb][name]
            cells.append(f"{t.kept}/{t.marked}" if t.marked else "-")
        table.append(
            f"| {name} | {tallies[labels[0]][name].compactions} | " + " | ".join(cells) + " |"
        )
    totals = {
        lb: (sum(t.kept for t in ts.values()), sum(t.marked for t in ts.values()))
        for lb, ts in tallies.items()
    }
    shares = {lb: k / m if m else 1.0 for lb, (k, m) in totals.items()}
    table.append(
        "| **all** | | "
        + " | ".join(f"**{k}/{m} ({shares[lb]:.1%})**" for lb, (k, m) in totals.items())
        + " |"
    )
    probe_lines = [
        "",
        "| probe | " + " | ".join(f"{lb}: compacted + recall / full" for lb in labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for kind in ("recall", "artifact", "continuation"):
        cells = []
        for lb in labels:
            asked = [t.probes.get(kind, [0, 0, 0]) for t in tallies[lb].values()]
            n, c, f = (sum(a[i] for a in asked) for i in range(3))
            cells.append(f"{c}/{n} / {f}/{n}" if n else "-")
        probe_lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lost = [
        f"{lb}, {name}: lost {', '.join(repr(x) for x in t.lost[:4])}"
        for lb, ts in tallies.items()
        for name, t in ts.items()
        if t.lost and lb != BASELINE
    ]
    met = all(s >= TARGET for lb, s in shares.items() if lb != BASELINE)
    from offpath.config import get_settings

    configured = get_settings()
    llm_line = (
        f"llm: the configured endpoint, {configured.openai_base_url or 'api.openai.com'} "
        f"({configured.summarization_model}); under make bench that is the benchmarks' stub LLM"
        if "llm" in tallies
        else "llm: none configured (set OPENAI_API_KEY / OPENAI_BASE_URL to measure one)"
    )
    missing_llm = "llm" not in tallies
    return Result(
        "10. Summary fidelity",
        ">= 95% of marked facts kept after compaction, with each summarizer",
        ", ".join(f"{lb} {s:.1%}" for lb, s in shares.items())
        + ("; no LLM configured (llm not measured)" if missing_llm else ""),
        met,
        [
            "marked facts: the cases' facts_for_fidelity, and in transcripts the facts the extractor "
            "marks as stated by the agent, fixed before compaction; counted only when compacted away, "
            "kept when their text is in the final thread",
            "each thread replayed turn by turn through planner, prompt, summarizer, fact guard and "
            "patch, compacting whenever over its threshold (the case's settings, else the defaults)",
            llm_line,
            f"'{BASELINE}': the generic stub with SUMMARY_PINNED_MAX_CHARS=0, not judged: what "
            "the guard lifts",
            "probes judged by exact match (no LLM judge configured), answered from the compacted "
            "thread plus a recall of the question's key words, and from the full thread",
            *lost[:8],
        ],
        "the guard pins at most SUMMARY_PINNED_MAX_CHARS per summary: a thread compacted many "
        "times keeps the facts the latest summaries carried forward, ranked",
        table + probe_lines,
    )
