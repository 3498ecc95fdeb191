"""Alias of :mod:`offpath.agent.sre_tools` (where the toolset lives since issue 23), so an
``AGENT_TOOLS=offpath.demo.sre_tools:SRE_TOOLS`` written before the move still loads."""

from offpath.agent.sre_tools import SRE_TOOLS

__all__ = ["SRE_TOOLS"]
