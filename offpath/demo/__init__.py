"""The demo's fixtures (:mod:`offpath.demo.sre`: ``examples/sre`` installed with the
package) that the agent's SRE tools (:mod:`offpath.agent.sre_tools`) read.

``offpath.demo.sre_tools`` is kept as an alias of :mod:`offpath.agent.sre_tools`, so an
``AGENT_TOOLS`` setting written before the move still loads."""
