"""The fact guard: the specifics of the removed messages that a summary must not lose.

Pure functions, no I/O. :func:`extract` finds the facts of a list of messages with
regular expressions: identifiers (pod, host and service names, ticket and trace ids,
commit SHAs, file paths, URLs, versions, environment variable names, function names),
error and exit codes (in any letter case), configuration values and counts, numbers with
units (CPU millicores too), and timestamps. Identifiers of any domain (an order id
``#W2378156``, a user id ``chen_johnson_4204``, a ten-digit item id) are recognised by their
shape, and bare numbers count only by their use: passed as a tool argument, asked for by
the user, or recurring. In what the agent or the
user writes, names (in backticks or bare: ``ForeignKey``, ``old_name``, ``models.py``) and
line numbers are facts too. :func:`rank` orders them by what the agent relies on: said by
the agent in its own words (its conclusions, figures and ranges with units, the names it
chose), asked by the user, passed to a tool, then seen in several messages, then what only
tool output holds; a fact carried from an earlier summary stays ahead of new ones (no
telephone game), each span's in turn, and what the agent said or the user named that an
earlier compaction took out of view (its loss report) is pinned again ahead of identifiers
only tool output holds. Opaque values only tool output holds (times of day,
request, trace and hex ids) are never listed one by one: :func:`pin` writes a time range
and counts. Facts seen only on noise lines (healthy rows of a table, directory listings,
``kubectl describe`` boilerplate) are not pinned unless used elsewhere.
:func:`pin` appends the facts a summary missed as a bounded **Pinned facts**
section; each entry is the line the fact was found on, clipped, with the id of
the message it came from, so the ``recall`` tool can fetch the original from the
archive.

It runs after any summarizer (the LLM's or the offline one): see
:class:`offpath.compaction.summarizers.guarded.GuardedSummarizer`.

The parts: :mod:`.patterns` (the kinds of fact and :func:`find`), :mod:`.reading` (how a
message is read for facts), :mod:`.extraction` (:class:`Fact`, :func:`extract`,
:func:`warm`, :func:`rank`), :mod:`.pinning` (:func:`pin`, :func:`swap_check`) and
:mod:`.sections` (the sections' headings and entry formats).
"""
