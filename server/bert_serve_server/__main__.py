"""``python -m bert_serve_server COMMAND`` (or ``bert-serve-server COMMAND``):

    start | stop | status | key | url | predict-url | models   one TorchServe (``control``)
    package --model-dir DIR [...]                              a .mar (``archive``)
    size --out FILE [--plan-out|--plan PLAN] -- TORCHSERVE_ARGS  the sizing step (``sizing``)
    ready [--live] [--config FILE]                             the pod's probe (``ready``)
    metrics [--state-dir DIR]                                  a live summary (``live_metrics``)
    layout [--out DIR] [--models ...]                          the container layout (``layout``)

Each command imports only its own module: ``size`` runs in the image, where ``handler/`` and
the checkout are absent.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command, rest = (args[0], args[1:]) if args else ("", [])
    if command == "package":
        from bert_serve_server import archive

        return archive.main(rest)
    if command == "size":
        from bert_serve_server import sizing

        return sizing.main(rest)
    if command == "ready":
        from bert_serve_server import ready

        return ready.main(rest)
    if command == "metrics":
        from bert_serve_server import live_metrics

        return live_metrics.main(rest)
    if command == "layout":
        from bert_serve_server import layout

        return layout.main(rest)
    if command in ("-h", "--help", ""):
        print(__doc__)
        return 0 if command else 2
    from bert_serve_server import control

    return control.main(args)


if __name__ == "__main__":
    sys.exit(main())
