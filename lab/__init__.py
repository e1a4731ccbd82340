"""The lab: what measures and tests the server, run from a checkout (lab/README.md lists each
measurement, its command and the page it writes).

``scripts/`` are the entry points; the experiments and what they share live here, typed:
``load`` (the one closed-loop load generator), ``corpus``, ``batchlog``, ``measure``, ``bench``,
``tune``, ``compare``, ``inprocess``, ``peer``, ``reports``, ``chaos/`` (one module per
experiment), ``soak``, ``fuzz``, ``defaults_check``, ``standins``, ``image`` and ``image_checks``,
``proxy`` and ``code_routes`` (for tests).

It imports the server package (``bert_serve_server``: start, size, stop); nothing there imports
this package. It needs the server and dev extras and the repository's files (config/,
scripts/data/), so it is never installed.
"""
