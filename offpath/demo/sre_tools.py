"""Alias of :mod:`offpath.agent.sre_tools`, where the toolset lives, so that
``AGENT_TOOLS=offpath.demo.sre_tools:SRE_TOOLS`` loads the same tools."""

from offpath.agent.sre_tools import SRE_TOOLS

__all__ = ["SRE_TOOLS"]
