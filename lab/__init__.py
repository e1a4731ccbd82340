"""The lab: what measures and tests the server, run from a checkout (lab/README.md lists each
tool, its command and the page it writes). ``python -m lab NAME`` runs a tool (``__main__``).

It imports the server package (``bert_serve_server``: start, size, stop) and the build's
``training``; nothing there imports this package. It needs the server and dev extras and the
repository's files (config/, scripts/data/), so it is never installed.
"""
