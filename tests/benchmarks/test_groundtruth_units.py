"""Benchmark 14's listing of the facts out of view (``GROUNDTRUTH_DUMP``)."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from bench.groundtruth import lost_entry


def test_a_fact_out_of_view_is_listed_with_its_source_and_the_summary_then():
    posted = [
        HumanMessage(content="change my booking", id="h1"),
        AIMessage(content="", tool_calls=[{"id": "c1", "name": "get_user", "args": {}}], id="a1"),
        ToolMessage(
            content='{"reservations": ["PUNERT"]}', tool_call_id="c1", name="get_user", id="t1"
        ),
    ]
    summary = HumanMessage(
        content="**Pinned facts**:\n- ids: HAT214",
        additional_kwargs={"lc_source": "summarization"},
        id="s1",
    )
    entry = lost_entry("airline#3", "PUNERT", "reservation_id", posted, [summary], 7)
    assert entry.startswith(
        "=== airline#3 'PUNERT' (reservation_id) first in tool get_user; out of view at message 7\n"
    )
    assert "    - ids: HAT214\n" in entry
    assert "(no summary)" in lost_entry("x", "PUNERT", "k", posted, posted, 1)
