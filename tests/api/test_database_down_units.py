"""The API's answer to a database error raised by a route: the database's 503 with
``Retry-After`` when the connection was found lost, whatever class the driver gave the
error; a 500 for any other database error (a constraint, a bad statement)."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy.exc
from fastapi.testclient import TestClient

from offpath.api.app import create_app
from offpath.api.deps import DATABASE_DOWN, DATABASE_RETRY_AFTER_S
from offpath.compaction.settings import Settings

#: libpq's words for a link that timed out: no SQLSTATE, so psycopg raises a bare DatabaseError.
LOST = psycopg.DatabaseError("could not receive data from server: Connection timed out")


def raising(exc: Exception):
    def route() -> None:
        raise exc

    return route


@pytest.fixture
def client(tmp_path) -> TestClient:
    app = create_app(Settings(_env_file=None, data_dir=str(tmp_path)))
    app.add_api_route(
        "/lost",
        raising(
            sqlalchemy.exc.DBAPIError.instance(
                "select 1", None, LOST, psycopg.Error, connection_invalidated=True
            )
        ),
    )
    app.add_api_route(
        "/live",
        raising(sqlalchemy.exc.DBAPIError.instance("select 1", None, LOST, psycopg.Error)),
    )
    app.add_api_route(
        "/constraint",
        raising(
            sqlalchemy.exc.DBAPIError.instance(
                "insert", None, psycopg.IntegrityError("duplicate key"), psycopg.Error
            )
        ),
    )
    return TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1")


def test_a_database_error_on_a_lost_connection_answers_503_whatever_its_class(client):
    r = client.get("/lost")
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == str(DATABASE_RETRY_AFTER_S)
    assert r.json() == {"detail": DATABASE_DOWN}


@pytest.mark.parametrize("path", ["/live", "/constraint"])
def test_a_database_error_on_a_live_connection_stays_a_500(client, path):
    r = client.get(path)
    assert r.status_code == 500, r.text
    assert "retry-after" not in r.headers
