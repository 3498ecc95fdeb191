"""Loading the settings: from the environment, ``.env`` and ``/run/secrets``.

The core's :class:`~offpath.compaction.settings.Settings` is a plain model of the values
and their rules; :class:`EnvironmentSettings` is the same model read by pydantic-settings
(environment variables named after the fields, any letter case; then ``.env``, or the file
``OFFPATH_ENV_FILE`` names; then the files of :data:`SECRETS_DIR`). Every process reads its
settings here once (:func:`get_settings`), or is given them.

Imports only :mod:`offpath.compaction`: every layer that does I/O may use it
(``tests/test_layout.py``).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from offpath.compaction.settings import Settings, SettingsError

#: Where Docker (Compose secrets, Swarm) mounts secrets: a file named after a setting
#: (``database_password``) sets it, when the environment does not.
SECRETS_DIR = "/run/secrets"

#: How settings are read: ``.env`` (UTF-8), names in any letter case, unknown names ignored.
ENVIRONMENT = SettingsConfigDict(
    env_file=".env", env_file_encoding="utf-8", extra="ignore", case_sensitive=False
)


class EnvironmentSettings(Settings, BaseSettings):
    """:class:`~offpath.compaction.settings.Settings` read from the environment, ``.env`` and
    secrets (arguments win); the same fields, defaults and rules."""

    model_config = ENVIRONMENT


_S = TypeVar("_S", bound=BaseSettings)


class ClientSettings(BaseSettings):
    """The settings a client of the API reads (``offpath replay``, ``stats``, ``sessions``,
    ``show``, ``compact``): where the API is and the key to send, from the same environment,
    ``.env`` and secrets as :class:`Settings`, with the same rules.

    Validated alone: a server-only setting that a client does not use (say
    ``SUMMARIZATION_KEEP_CHARS`` over the threshold in a shared ``.env``) cannot stop it
    (``offpath stats`` would exit 2 on one).
    """

    model_config = ENVIRONMENT

    api_url: str = Settings.model_fields["api_url"]
    offpath_api_key: SecretStr | None = Settings.model_fields["offpath_api_key"]


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment and ``.env``; ``overrides`` win.

    ``OFFPATH_ENV_FILE`` names another file to read instead of ``.env`` (empty: none;
    the tests use that so a developer's ``.env`` cannot leak into them). Files in
    :data:`SECRETS_DIR`, where it exists, set the settings they are named after (the
    environment wins). Raises :class:`SettingsError` with one line per bad setting, naming it.
    """
    return _load(EnvironmentSettings, overrides)


def load_client_settings(**overrides: object) -> ClientSettings:
    """:class:`ClientSettings`, read as :func:`load_settings` reads :class:`Settings`; raises
    :class:`SettingsError` naming a bad ``API_URL`` or ``OFFPATH_API_KEY`` only."""
    return _load(ClientSettings, overrides)


def _load(cls: type[_S], overrides: dict[str, object]) -> _S:
    env_file = os.environ.get("OFFPATH_ENV_FILE", ".env") or None
    secrets_dir = SECRETS_DIR if Path(SECRETS_DIR).is_dir() else None
    try:
        return cls(_env_file=env_file, _secrets_dir=secrets_dir, **overrides)  # type: ignore[arg-type,call-arg]
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ())).upper()
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            if loc and err.get("type") != "value_error":
                msg += f" (got {str(err.get('input'))[:60]!r})"
            lines.append(f"{loc}: {msg}" if loc else msg)
        raise SettingsError("invalid settings: " + "; ".join(lines)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
