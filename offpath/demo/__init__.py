"""The demo's fixtures (:mod:`offpath.demo.sre`: ``examples/sre`` installed with the
package) that the agent's SRE tools (:mod:`offpath.agent.sre_tools`) read.

``offpath.demo.sre_tools`` is an alias of :mod:`offpath.agent.sre_tools`, so an
``AGENT_TOOLS`` setting that names it loads the same tools."""
