"""Every byte a client sends counts (DESIGN.md invariant 8).

* :class:`BodyLimit`, an ASGI middleware, sees every request before the app does:

  - a request with a body and no valid API key is refused (401) before one byte of the
    body is read (nothing of an unauthenticated request is parsed), except the web UI's
    login form (a few KiB at most);
  - a query string with a NUL character is refused (422 naming the parameter: PostgreSQL
    stores no NUL);
  - the bytes of bodies in flight (being received or handled) are bounded per process and
    per key (:class:`InFlight`: :data:`IN_FLIGHT_BODIES` and :data:`IN_FLIGHT_BODIES_PER_KEY`
    bodies of ``MAX_REQUEST_BYTES``; 503 and 429 beyond, with ``Retry-After``), the declared
    size held before a byte is read;
  - the body is checked in one streaming pass as it arrives (:class:`JsonScan`): over
    ``MAX_REQUEST_BYTES`` 413, nested deeper than ``MAX_JSON_DEPTH``, more values than
    ``MAX_JSON_VALUES`` (or more tokens than they hold) or more ``messages`` than
    ``MAX_TURN_MESSAGES`` 422, each before anything is parsed; memory is the body itself
    plus a few bytes per nesting level, and the pass gives the event loop back every
    :data:`SLICE_BYTES`.

* :class:`OffLoopBody`, the routes' class: a JSON body is parsed (by orjson, from the
  bytes, when its numbers are plain) and validated (a turn one message at a time) in a
  worker thread, in calls short enough that the event loop goes on serving (``/healthz``
  answers meanwhile; ``offpath_api_event_loop_lag_seconds`` shows how late it wakes).
* :func:`unstorable`: values a JSON parser returns but no store keeps (NUL, a lone surrogate
  from the escape ``"\\ud800"``, an integer beyond 64 bits, NaN): refused with 422 naming
  the field.
* :func:`check_message`: JSON carried inside a message's strings (an OpenAI tool call's
  ``arguments``...) read once with the body's rules, within the turn's
  :class:`JsonBudget` (the values the body's scan left), before anything measures or stores
  it.
* :func:`short`: what an error may quote of the input (422 answers never echo it).
* :class:`HostCheck`: Starlette's ``Host`` check (``ALLOWED_HOSTS``), whose 400 is JSON
  like every other error answer.

Its modules: :mod:`.checks` (the plain checks: media type, unstorable values, NUL in a query,
:func:`short`), :mod:`.scan` (:class:`JsonScan`), :mod:`.inner` (JSON inside strings),
:mod:`.middleware` (:class:`BodyLimit`, :class:`HostCheck`, :func:`refuse`), :mod:`.offloop`
(:class:`OffLoopBody`).
"""
