"""``/turns`` and ``offpath replay`` accept every valid OpenAI chat message shape (issue 19,
item 6), built with the OpenAI SDK's own types (``tests/openai_shapes.py``), on real
processes: the turns are appended with no warning, a compaction over them applies with every
tool call paired, and the archive keeps what was removed as it was sent."""

from __future__ import annotations

import json
import uuid

import pytest
from openai_shapes import catalogue
from shared import from_api, pairing_problems
from stack import wait_for

from offpath.compaction.formats import LEGACY_CALL_PREFIX

from .test_cli import run  # the command line as a user runs it

pytestmark = pytest.mark.usefixtures("stub")

#: Small enough that the catalogue and a few padding turns cross it.
SMALL = {"SUMMARIZATION_THRESHOLD_CHARS": "4000", "SUMMARIZATION_KEEP_CHARS": "1500"}


def padding(k: int) -> list[dict]:
    """One more turn in OpenAI format: a question, a call with no content key, a long result."""
    cid = f"call_pad_{k}"
    return [
        {"role": "user", "content": [{"type": "text", "text": f"and shard {k}?"}]},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": "logs", "arguments": json.dumps({"shard": k})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": cid, "content": f"shard {k}: ok\n" + "line\n" * 200},
    ]


def test_every_sdk_shape_is_appended_compacted_and_archived(stacks, backend):
    stack = stacks.get(backend, **SMALL)
    session = f"oai-{uuid.uuid4().hex[:8]}"
    shapes = catalogue()
    # the deprecated function result comes in a post of its own, after its call
    for part in (shapes[:9], shapes[9:]):
        r = stack.post_turn(session, part)
        assert r.status_code == 200, r.text
        assert r.json()["warnings"] == []
    thread = from_api(stack.messages(session))
    assert len(thread) == len(shapes) and pairing_problems(thread) == set()
    assert thread[2].content == shapes[2]["content"]  # the user's parts, as sent
    assert thread[9].tool_call_id == f"{LEGACY_CALL_PREFIX}get_limits"
    k = 0
    while not any(j["status"] == "applied" for j in stack.jobs(session)):
        assert k < 12, stack.jobs(session)
        assert stack.post_turn(session, padding(k)).status_code == 200
        k += 1
        stack.settle(session, False, 0)
    after = from_api(stack.messages(session))
    assert pairing_problems(after) == set()
    archived = stack.http.get(f"/sessions/{session}/archive").json()["messages"]
    by_id = {m["message_id"]: m for m in archived}
    ask = by_id.get(thread[2].id)
    assert ask is not None and ask["content"] == shapes[2]["content"]


def test_replay_reads_a_file_of_every_sdk_shape(stacks, tmp_path):
    stack = stacks.get("sqlite", **SMALL)
    f = tmp_path / "every-shape.json"
    f.write_text(json.dumps({"messages": catalogue()}))
    session = f"oai-replay-{uuid.uuid4().hex[:8]}"
    result = run(
        ["replay", str(f), "--url", stack.url, "--session", session, "--format", "openai"],
        env={"OFFPATH_API_KEY": stack.key},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    thread = wait_for(lambda: from_api(stack.messages(session)))
    assert len(thread) == len(catalogue()) and pairing_problems(thread) == set()
