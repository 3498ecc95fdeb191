"""What the reconciler reads to find a job whose message a dead worker took: the broker's
unacknowledged messages (:func:`offpath.coordination.broker.held_unacked`, removed by
:func:`~offpath.coordination.broker.drop_unacked`), on a real Redis, with a real kombu
consumer that takes a job's message and never acknowledges it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from kombu import Connection
from stack import REDIS_URL

from offpath.compaction.settings import Settings
from offpath.coordination.broker import drop_unacked, forget_queue, held_unacked
from offpath.coordination.queue import publisher


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"test-lost-{uuid.uuid4().hex[:8]}"
    yield name
    forget_queue(REDIS_URL, name)


def test_a_taken_unacknowledged_message_is_found_by_its_job_and_dropped_once(queue):
    settings = Settings(redis_url=REDIS_URL, celery_queue=queue, data_dir="/tmp")
    job, other = uuid.uuid4().hex, uuid.uuid4().hex
    publish = publisher(settings)
    publish("s1", job, None)
    publish("s2", other, None)
    with Connection(REDIS_URL) as conn:
        consumer = conn.SimpleQueue(queue)
        taken = consumer.get(timeout=5)  # not acknowledged: it waits in kombu's hash
        assert taken.headers["id"] == job
        assert held_unacked(REDIS_URL, [other], time.time() + 1) == {}  # still queued
        found = held_unacked(REDIS_URL, [job, other], time.time() + 1)
        assert list(found) == [job]
        assert held_unacked(REDIS_URL, [job], time.time() - 60) == {}  # taken since then
        assert drop_unacked(REDIS_URL, found[job]) is True
        assert drop_unacked(REDIS_URL, found[job]) is False  # once
        assert held_unacked(REDIS_URL, [job], time.time() + 1) == {}
        consumer.close()  # a consumer's close gives back what it holds: not a dropped one
    with Connection(REDIS_URL) as conn:
        consumer = conn.SimpleQueue(queue)
        left = consumer.get(timeout=5)
        left.ack()
        assert left.headers["id"] == other
        with pytest.raises(consumer.Empty):
            consumer.get(timeout=1)
        consumer.close()


def test_in_broker_sees_a_queued_and_a_taken_message_not_an_acknowledged_one(queue):
    from offpath.coordination.broker import in_broker

    settings = Settings(redis_url=REDIS_URL, celery_queue=queue, data_dir="/tmp")
    queued, taken, acked = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    publish = publisher(settings)
    for job in (acked, taken, queued):
        publish("s", job, None)
    with Connection(REDIS_URL) as conn:
        consumer = conn.SimpleQueue(queue)
        first = consumer.get(timeout=5)
        assert first.headers["id"] == acked
        first.ack()
        assert consumer.get(timeout=5).headers["id"] == taken  # not acknowledged
        assert in_broker(REDIS_URL, queue, [queued, taken, acked]) == {queued, taken}
        consumer.close()
