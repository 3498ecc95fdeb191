"""Alembic environment: the usage tables' metadata, the URL from the project's settings.

One migrator at a time across processes (an API, a worker and ``offpath migrate`` may
start together on a fresh database): on PostgreSQL an advisory lock taken inside the
migration transaction, so it is held until the DDL is committed; on SQLite a file lock
beside the database. The second migrator then reads the revision the first committed
and has nothing to do. The revisions before and after are left in
``config.attributes`` (``revision_before``, ``revision_after``) for :func:`offpath.stores.db.migrate`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from alembic import context
from sqlalchemy import engine_from_config, make_url, pool
from sqlmodel import SQLModel

import offpath.stores.archive  # noqa: F401 - its tables are part of the metadata
import offpath.stores.tenants  # noqa: F401
from offpath.config import get_settings
from offpath.stores.db.engine import MIGRATIONS_LOCK_KEY, file_lock, sqlalchemy_url

config = context.config
target_metadata = SQLModel.metadata
url = config.get_main_option("sqlalchemy.url") or sqlalchemy_url(get_settings())


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def sqlite_lock() -> AbstractContextManager[object]:
    """A file lock beside a SQLite database file (nothing for other databases)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return nullcontext()
    return file_lock(Path(f"{parsed.database}.migrate.lock"))


def run_migrations_online() -> None:
    connectable = engine_from_config(
        {"sqlalchemy.url": url}, prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with sqlite_lock(), connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        migration = context.get_context()
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":  # released by the commit, not before
                connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATIONS_LOCK_KEY})")
            config.attributes["revision_before"] = migration.get_current_revision()
            context.run_migrations()
            config.attributes["revision_after"] = migration.get_current_revision()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
