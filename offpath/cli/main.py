"""The ``offpath`` command: demo, replay, stats, and starting the API, a worker or Flower.

Errors are one line on stderr and a non-zero exit: 1 for bad input or a failed
request, 2 for bad settings.

The entry point (``[project.scripts] offpath = "offpath.cli.main:app"``, and
``python -m offpath.cli.main``). The commands are registered on :mod:`offpath.cli.common`'s
``app`` by the modules imported here, in the order ``offpath --help`` lists them:
:mod:`~offpath.cli.conversations` (replay, stats, sessions, show), :mod:`~offpath.cli.jobs`
(compact, revert), :mod:`~offpath.cli.processes` (api, worker, flower, beat, migrate),
:mod:`~offpath.cli.keys` (the ``keys`` sub-app) and :mod:`~offpath.cli.demo_command` (demo).
The names this module held before they moved there are imported back from them.
"""

from __future__ import annotations

import subprocess

from offpath.cli.common import (
    ApiKeyOption,
    CliError,
    UrlOption,
    api_client,
    app,
    call_api,
    check_answer,
    client_settings_or_exit,
    console,
    counted,
    detect_format,
    err,
    fail,
    migrate_or_exit,
    print_stats,
    read_conversation,
    replay_file,
    session_name,
    settings_or_exit,
)

# the command modules register their commands as they are imported: in this order, the
# order `offpath --help` lists them in
# isort: off
from offpath.cli.conversations import (
    FORMATS,
    NO_SESSIONS_HINT,
    print_sessions,
    replay,
    sessions,
    show,
    stats,
)
from offpath.cli.jobs import compact, revert
from offpath.cli.processes import (
    CELERY,
    STOP_SIGNALS,
    api,
    beat,
    flower,
    migrate,
    supervise,
    worker,
)
from offpath.cli.keys import keys_app, keys_create, keys_list, keys_revoke
from offpath.cli.demo_command import demo
# isort: on

__all__ = [
    "CELERY",
    "FORMATS",
    "NO_SESSIONS_HINT",
    "STOP_SIGNALS",
    "ApiKeyOption",
    "CliError",
    "UrlOption",
    "api",
    "api_client",
    "app",
    "beat",
    "call_api",
    "check_answer",
    "client_settings_or_exit",
    "compact",
    "console",
    "counted",
    "demo",
    "detect_format",
    "err",
    "fail",
    "flower",
    "keys_app",
    "keys_create",
    "keys_list",
    "keys_revoke",
    "main",
    "migrate",
    "migrate_or_exit",
    "print_sessions",
    "print_stats",
    "read_conversation",
    "replay",
    "replay_file",
    "revert",
    "session_name",
    "sessions",
    "settings_or_exit",
    "show",
    "stats",
    "supervise",
    "worker",
]


def main() -> None:  # pragma: no cover - console script
    try:
        app()
    except subprocess.CalledProcessError as exc:
        fail(str(exc))


if __name__ == "__main__":  # pragma: no cover
    app()
