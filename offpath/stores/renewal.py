"""What this process holds in a store that expires it (a job's running lease, a thread's
lock), kept alive while held: :class:`Renewer`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable

log = logging.getLogger("offpath.renewal")


class Renewer:
    """One daemon thread per process that calls, every ``interval_s``, the ``renew`` of each
    thing held (started on first use, and again in a forked child, which inherits no threads).

    ``renew`` returns False when the thing is no longer this holder's (it expired, or was
    taken over): it is dropped and its ``lost`` is called, unless its holder dropped it
    meanwhile (a renewal of a snapshot raced its release: nothing was lost). An exception
    from ``renew`` (its store did not answer) is logged as a warning naming ``what``; the
    next round tries again."""

    def __init__(self, interval_s: float, name: str) -> None:
        self.interval_s = interval_s
        self.name = name
        self._held: dict[Hashable, tuple[Callable[[], bool], Callable[[], None], str]] = {}
        self._guard = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(
        self, key: Hashable, renew: Callable[[], bool], lost: Callable[[], None], what: str
    ) -> None:
        with self._guard:
            self._held[key] = (renew, lost, what)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def drop(self, key: Hashable) -> None:
        with self._guard:
            self._held.pop(key, None)

    def stop(self) -> None:
        """Renew nothing more (what is held lapses)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._wake.wait(self.interval_s):
            with self._guard:
                held = list(self._held.items())
            for key, (renew, lost, what) in held:
                try:
                    kept = renew()
                except Exception as exc:  # the store is away: try again next round
                    log.warning("could not renew %s: %s", what, exc)
                    continue
                if kept:
                    continue
                with self._guard:  # dropped meanwhile by its holder: nothing lost
                    still_held = self._held.pop(key, None) is not None
                if still_held:
                    lost()
