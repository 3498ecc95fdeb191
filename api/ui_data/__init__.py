"""What the web UI's pages show (:mod:`api.ui`), read in-process from the service layer.

Every function takes the runtime and the caller (a :class:`~offpath.stores.tenants.Principal`)
and returns plain dicts and lists for the Jinja2 templates; nothing here renders HTML.
A non-admin caller sees only the sessions its tenant owns, as in the JSON API.

* :mod:`.dashboard`: :func:`dashboard_stats`, the ``/stats`` body
  (:func:`offpath.stores.usage.stats`, as the route computes it; its ``recent_failures``
  too) and its widgets, each tagged with its JSON path in that body;
* :mod:`.chart`: :func:`size_chart`, thread size over time for the busiest sessions, as SVG
  coordinates;
* :mod:`.listing`: :func:`session_page`, a page of the sessions list (``GET /sessions``'s
  :func:`offpath.stores.usage.list_sessions`);
* :mod:`.thread`: :func:`thread_items` / :func:`originals_by_summary`, one session's thread
  as the model sees it, and the archived originals each summary replaced; its fixed part
  (:func:`fixed_part_of`).
"""
