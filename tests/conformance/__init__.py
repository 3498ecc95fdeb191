"""The conformance suite of agent shapes (issue 30, item 3): one set of properties
(:mod:`.properties`), checked after a real run of every shape (:mod:`.shapes`), in the style
of LangGraph's checkpoint-conformance suite. :mod:`.harness` holds what the shapes share: the
scripted chat model, the scripted tools, and the reading of a run's checkpoints and archive
into a :class:`~.harness.Run` that the properties judge."""
