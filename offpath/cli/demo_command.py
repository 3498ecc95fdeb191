"""The ``offpath demo`` command. Its run (:func:`offpath.cli.demo.run_demo`) is imported
only when the demo runs: the other commands do not load what it needs (Redis, the broker
helpers)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from offpath.cli.common import (
    CliError,
    app,
    fail,
    settings_or_exit,
)


@app.command()
def demo(
    file: Annotated[
        Path | None, typer.Option(help="Conversation to replay (default: the example)")
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the compaction jobs", min=1)
    ] = 90,
    serve: Annotated[
        bool,
        typer.Option(help="Keep the API (and its dashboard at /ui) up until Ctrl-C", metavar=""),
    ] = False,
    port: Annotated[
        int,
        typer.Option(
            help="The API's port on 127.0.0.1 (0: a free one)", metavar="<port>", min=0, max=65_535
        ),
    ] = 0,
) -> None:
    """Run the whole loop on embedded defaults: worker, API, an agent asked six questions about
    an incident (--file: a conversation replayed instead), /stats, and the dashboard's URL."""
    from offpath.cli.demo import run_demo

    settings = settings_or_exit()
    try:
        code = run_demo(settings, file, timeout, serve, port)
    except CliError as exc:
        fail(str(exc))
    raise typer.Exit(code)
