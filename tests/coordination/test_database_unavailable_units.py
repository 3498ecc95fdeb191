"""Which errors say a database did not answer (the API's 503 with ``Retry-After``), whatever
the class the driver gave them, and which stay errors of their own (a 500): real PostgreSQL,
reached through a TCP forwarder that is killed to drop the link."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
import sqlalchemy.exc
from stack import PG_ADMIN, free_port

from offpath.coordination.outages import database_unavailable

FORWARDER = Path(__file__).resolve().parents[1] / "tcp_forwarder.py"


@pytest.fixture
def dropped_link_error() -> sqlalchemy.exc.DBAPIError:
    """What SQLAlchemy raises for a statement on a pooled connection whose link dropped."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(FORWARDER), "127.0.0.1", str(port), "127.0.0.1", "5432"],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        url = sa.engine.make_url(PG_ADMIN).set(
            drivername="postgresql+psycopg", host="127.0.0.1", port=port
        )
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
            proc.kill()
            proc.wait(timeout=10)
            with pytest.raises(sqlalchemy.exc.DBAPIError) as caught:
                conn.execute(sa.text("select 1"))
        return caught.value
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_statement_on_a_dropped_link_is_a_database_outage(dropped_link_error):
    assert dropped_link_error.connection_invalidated
    assert database_unavailable(dropped_link_error)


def test_any_driver_error_on_a_connection_found_lost_is_an_outage_whatever_its_class():
    """libpq's own errors carry no SQLSTATE, which psycopg raises as a bare ``DatabaseError``;
    SQLAlchemy wraps it as its ``DatabaseError`` and marks the connection invalidated when
    the dialect finds the connection lost."""
    lost = psycopg.DatabaseError("could not receive data from server: Connection timed out")
    wrapped = sqlalchemy.exc.DBAPIError.instance(
        "select 1", None, lost, psycopg.Error, connection_invalidated=True
    )
    assert type(wrapped) is sqlalchemy.exc.DatabaseError
    assert database_unavailable(wrapped)
    same_on_a_live_connection = sqlalchemy.exc.DBAPIError.instance(
        "select 1", None, lost, psycopg.Error, connection_invalidated=False
    )
    assert not database_unavailable(same_on_a_live_connection)


def test_an_error_raised_from_a_database_outage_is_one(dropped_link_error):
    try:
        try:
            raise dropped_link_error
        except sqlalchemy.exc.DBAPIError as exc:
            raise RuntimeError("the checkpointer could not read the thread") from exc
    except RuntimeError as wrapped:
        assert database_unavailable(wrapped)


def test_a_statement_the_database_refuses_is_not_an_outage():
    engine = sa.create_engine(
        sa.engine.make_url(PG_ADMIN).set(drivername="postgresql+psycopg"),
        poolclass=sa.pool.NullPool,
    )
    with engine.connect() as conn, pytest.raises(sqlalchemy.exc.DBAPIError) as caught:
        conn.execute(sa.text("select * from no_such_table_here"))
    assert isinstance(caught.value, sqlalchemy.exc.ProgrammingError)
    assert not caught.value.connection_invalidated
    assert not database_unavailable(caught.value)
    assert not database_unavailable(ValueError("not a database error"))


def test_libpq_s_own_word_on_the_link_is_an_outage_even_unwrapped():
    """A checkpointer on psycopg's pool raises the driver's errors as they are."""
    assert database_unavailable(psycopg.DatabaseError("server closed the connection unexpectedly"))
    with psycopg.connect(PG_ADMIN) as conn, pytest.raises(psycopg.Error) as caught:
        conn.execute("select * from no_such_table_here")
    assert caught.value.sqlstate == "42P01"  # the server's word: not the link's
    assert not database_unavailable(caught.value)
    assert not database_unavailable(psycopg.ProgrammingError("the query has 1 placeholder"))


def test_a_job_whose_database_link_was_lost_is_run_again_later_whatever_the_error_s_class():
    from redis.exceptions import ConnectionError as RedisDown

    from offpath.worker.jobs import transient_store_error

    lost = psycopg.DatabaseError("could not receive data from server: Connection timed out")
    assert transient_store_error(
        sqlalchemy.exc.DBAPIError.instance(
            "select 1", None, lost, psycopg.Error, connection_invalidated=True
        )
    )
    assert transient_store_error(RedisDown("Connection refused"))
    constraint = sqlalchemy.exc.DBAPIError.instance(
        "insert", None, psycopg.IntegrityError("duplicate key"), psycopg.Error
    )
    assert not transient_store_error(constraint)  # a fault of ours: the job fails, named
