"""A read-only SRE toolset for the demo agent: logs, metrics, recent deploys, pod status.

``SRE_TOOLS`` (the default of ``AGENT_TOOLS``) is four LangChain tools that answer
from the fixture files of ``examples/sre/`` (written by
``examples/make_sre_fixtures.py``): the cluster prod-eu-1 at 2025-03-11 14:30 UTC,
25 minutes into the checkout-api latency incident of the example investigation.

* :func:`get_logs` -- container log lines of a service (or some of its pods), by time
  window and regex, newest last.
* :func:`query_metrics` -- a small PromQL matcher over the per-minute fixture series:
  metric name (or one of the raw names a recording rule answers for), label matchers,
  one ``sum|avg|max|min|count [by|without (...)]`` aggregation; a text table.
* :func:`recent_deploys` -- helm history of a release with each revision's pipeline and
  changes (the config diff included).
* :func:`pod_status` -- ``kubectl get pods -o wide`` with a label selector, and why pods
  are not ready or restarted.

Every answer is text an SRE would read, at most :data:`MAX_CHARS` characters (what was cut
is said in the answer). Bad arguments, unknown services or pods and missing fixtures give
an answer starting with ``error:``; the tools never raise. (An argument of the wrong type,
``limit="lots"``, fails the tool's schema before it runs; the agent's tool node turns that
into an error ``ToolMessage`` too.)

The fixture folder is looked up at each call: ``DEMO_FIXTURES_DIR`` if set, else the copy
installed with the package (``offpath/demo/sre``: the wheel ships ``examples/sre`` there, so a
non-editable install such as the Docker image's has them), else
``examples/sre`` of the repository checkout this package lives in (an editable install).

This package holds ``SRE_TOOLS``; each tool is defined with what it does: :mod:`.logs`
(``get_logs``), :mod:`.metrics` (``query_metrics``) and :mod:`.cluster` (``recent_deploys``,
``pod_status``), over the helpers of :mod:`.fixtures` (finding and reading the fixtures,
errors, times, the answer cap).
"""

from __future__ import annotations

from langchain_core.tools import BaseTool

from offpath.agent.sre_tools.cluster import pod_status, recent_deploys
from offpath.agent.sre_tools.logs import get_logs
from offpath.agent.sre_tools.metrics import query_metrics

#: The demo agent's tools (``AGENT_TOOLS=offpath.agent.sre_tools:SRE_TOOLS``): all read-only.
SRE_TOOLS: list[BaseTool] = [get_logs, query_metrics, recent_deploys, pod_status]
