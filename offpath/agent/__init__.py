"""The agent side: what runs inside a LangGraph agent's model calls.

* :mod:`.middleware`: :class:`OffPathCompaction`, the LangChain agent middleware (the
  public ``from offpath import OffPathCompaction``);
* :mod:`.recall`: the ``recall`` tool over the archive;
* :mod:`.graph`: the API's own agent graph (model, tools, checkpointer) and the runtime
  that patches through it; the worker's graph of the same state with nothing to run, and
  its runtime;
* :mod:`.sre_tools`, :mod:`.scripted`: that agent's default read-only SRE tools and the
  scripted chat model it runs without an LLM.

May import :mod:`offpath.compaction`, :mod:`offpath.events`, :mod:`offpath.stores` and
:mod:`offpath.coordination`: never the worker, the API or the CLI
(``tests/test_layout.py`` checks it).
"""
