"""Alembic environment: the usage tables' metadata, the URL from the project's settings."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from compaction.settings import get_settings
from service.db import SQLModel, sqlalchemy_url

config = context.config
target_metadata = SQLModel.metadata
url = config.get_main_option("sqlalchemy.url") or sqlalchemy_url(get_settings())


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_from_config(
        {"sqlalchemy.url": url}, prefix="sqlalchemy.", poolclass=pool.NullPool
    )
    with connectable.connect() as connection:
        if connection.dialect.name == "postgresql":  # one migrator at a time across processes
            connection.exec_driver_sql("SELECT pg_advisory_lock(724201)")
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql("SELECT pg_advisory_unlock(724201)")
            connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
