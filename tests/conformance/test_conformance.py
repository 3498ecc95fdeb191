"""Every agent shape keeps every property (issue 30, item 3): each shape of
:mod:`conformance.shapes` runs once (a real agent, a real worker, a real checkpointer; cached
for the module), then each property of :mod:`conformance.properties` is its own test, so
that the shapes x properties table (``bench/conformance.py``) reads pass or fail per pair.

A pair that fails today for a known fault is ``xfail(strict=True)`` with the fault named
(:data:`KNOWN`): it turns into a failure the moment the fault is fixed, so that the mark is
removed with the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from conformance.harness import Run
from conformance.properties import PROPERTIES, held_compactions, own_compactions
from conformance.shapes import SHAPES, Env, reset_stub

pytestmark = pytest.mark.usefixtures("stub_server")

#: (shape, property) -> the known fault that breaks it today, as ``xfail(strict=True)``
#: (property ``compacts``: :func:`test_shape_compacts`).
KNOWN: dict[tuple[str, str], str] = {
    ("parallel_agents", "compacts"): (
        "two agent nodes sharing the parent's messages in one superstep are fanned (a thread "
        "one handed up whole would wipe the other's messages of that step): each compacts its "
        "own model calls and hands the parent its messages whole, so the parent's stored "
        "thread is compacted only by a node that runs alone in its step (none here); it grows "
        "turn after turn, every call still bounded"
    ),
}


#: The name :data:`KNOWN` gives :func:`test_shape_compacts`.
COMPACTS = "compacts"


def marks_of(shape: str, prop: str) -> list[pytest.MarkDecorator]:
    reason = KNOWN.get((shape, prop))
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def pairs() -> Iterator[object]:
    for shape, spec in SHAPES.items():
        for name in PROPERTIES:
            if name == "caller_untouched" and not spec.caller:
                continue
            yield pytest.param(shape, name, marks=marks_of(shape, name), id=f"{shape}-{name}")


@pytest.fixture(scope="module")
def runs(stacks, stub_server, tmp_path_factory) -> Callable[[str], Run]:
    """Each shape's run, made once for the module on first use; a shape whose run failed
    fails every one of its tests with that error."""
    env = Env(stacks, stub_server, tmp_path_factory.mktemp("conformance"))
    done: dict[str, Run | BaseException] = {}

    def get(shape: str) -> Run:
        if shape not in done:
            reset_stub(stub_server)
            try:
                done[shape] = SHAPES[shape].run(env)
            except Exception as exc:  # reported by each of the shape's tests
                done[shape] = exc
            finally:
                reset_stub(stub_server)
        got = done[shape]
        if isinstance(got, BaseException):
            raise AssertionError(f"the {shape} run failed: {got!r}") from got
        return got

    return get


@pytest.mark.parametrize(("shape", "prop"), list(pairs()))
def test_shape_keeps_property(runs, shape: str, prop: str) -> None:
    PROPERTIES[prop](runs(shape))


@pytest.mark.parametrize("shape", [pytest.param(s, marks=marks_of(s, COMPACTS)) for s in SHAPES])
def test_shape_compacts(runs, shape: str) -> None:
    """The shape's run exercised compaction: its root thread had a compaction of its own
    applied, and in a shape with a callee, so did a callee's thread. Without them the
    properties above would hold vacuously."""
    run = runs(shape)
    problems = []
    if not own_compactions(run, run.root):
        problems.append("the root thread had no compaction of its own applied")
    callees = [t for ns, t in run.threads.items() if ns]
    if SHAPES[shape].caller and not any(held_compactions(run, t) for t in callees):
        problems.append(f"none of the {len(callees)} callee threads had a compaction applied")
    assert not problems, (
        f"{shape}: "
        + "; ".join(problems)
        + (f" (compactions seen: {sorted(run.compactions)}, applied: {sorted(run.applied)})")
    )
