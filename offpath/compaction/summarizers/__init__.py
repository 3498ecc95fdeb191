"""Summarizer backends of the pure core behind one protocol (:mod:`.base`): the offline
summarizer (:mod:`.offline`) and the fact guard around any summarizer (:mod:`.guarded`).
The LLM backend, which calls the network, and :func:`~offpath.llm.make_summarizer`, which
picks one from settings, are in :mod:`offpath.llm`."""
