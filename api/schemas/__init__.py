"""Request, answer and error bodies of the API, as pydantic models (and so in its OpenAPI
document, which a schema-driven fuzzer reads: ``tests/integration/test_fuzz.py``).

Requests: :class:`ChatIn`, :class:`TurnIn` (its ``messages`` one of three shapes: OpenAI
chat format, LangChain transcript dicts, serialized LangChain messages, by role or type).
Answers: one model per route (``*Out``); the routes build plain dicts and FastAPI checks
them against these (``response_model_exclude_unset``: a key a route leaves out stays out).
Errors: :class:`Problem` (``{"detail": str}``), :class:`Invalid` for 422 (with ``errors``).

* :mod:`.messages`: the three shapes of a turn's messages and their tool calls;
* :mod:`.requests`: :class:`ChatIn`, :class:`TurnIn`;
* :mod:`.answers`: the session routes' and ``/stats``' answers;
* :mod:`.admin`: the session admin routes' answers, ``/healthz`` and ``/readyz``;
* :mod:`.problems`: error answers and the routes' lists of them.
"""
