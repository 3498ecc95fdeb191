"""``offpath keys``: the sub-app that creates, lists and revokes API keys (``keys create``,
``keys list``, ``keys revoke``)."""

from __future__ import annotations

import re
from typing import Annotated

import typer
from rich.table import Table

from offpath.cli.common import (
    app,
    console,
    err,
    fail,
    migrate_or_exit,
    settings_or_exit,
)
from offpath.compaction.settings import TENANT_PATTERN, TENANT_RULE

keys_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode="markdown", help="Create, list and revoke API keys."
)
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts for")],
    admin: Annotated[bool, typer.Option(help="An admin key sees every tenant")] = False,
) -> None:
    """Create a key; it is printed once (only its hash is stored)."""
    if not re.fullmatch(TENANT_PATTERN, tenant):
        fail(f"--tenant must be {TENANT_RULE}")
    settings = settings_or_exit()
    migrate_or_exit(settings)
    from offpath.stores.db.engine import make_engine
    from offpath.stores.tenants import create_key

    engine = make_engine(settings)
    key = create_key(engine, tenant, admin=admin)
    engine.dispose()
    err.print(f"key for tenant {tenant}{' (admin)' if admin else ''}; shown once, keep it:")
    print(key)


@keys_app.command("list")
def keys_list() -> None:
    """List keys (their prefixes, never the keys)."""
    settings = settings_or_exit()
    migrate_or_exit(settings)
    from offpath.stores.db.engine import make_engine
    from offpath.stores.tenants import list_keys

    engine = make_engine(settings)
    table = Table("prefix", "tenant", "admin", "created", "revoked")
    for k in list_keys(engine):
        table.add_row(
            k["prefix"],
            k["tenant"],
            "yes" if k["admin"] else "",
            f"{k['created_at']:%Y-%m-%d %H:%M}",
            f"{k['revoked_at']:%Y-%m-%d %H:%M}" if k["revoked_at"] else "",
        )
    engine.dispose()
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key: Annotated[str, typer.Argument(help="The key, or its prefix as `keys list` shows it")],
) -> None:
    """Revoke a key (it stops working within seconds)."""
    settings = settings_or_exit()
    migrate_or_exit(settings)
    from offpath.stores.db.engine import make_engine
    from offpath.stores.tenants import UnknownKey, revoke_key

    engine = make_engine(settings)
    try:
        n = revoke_key(engine, key)
    except UnknownKey as exc:
        fail(str(exc))
    finally:
        engine.dispose()
    console.print(f"revoked {n} key(s)")
