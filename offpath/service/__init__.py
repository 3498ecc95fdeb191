"""I/O shared by the API and the worker: checkpointer, agent graph, usage tables, locks,
the post-turn hook, and the process-wide :class:`~service.runtime.Runtime` that holds them."""
