"""Write the container / KServe layout of the model from config/config.properties
(``bert_serve_server.layout`` says what it rewrites and why).

    python scripts/deploy_layout.py [--out build/kserve]
    python scripts/deploy_layout.py --models "sentiment=DIR toxicity=DIR2"   # several models
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bert_serve_server.archive import package_models
from bert_serve_server.config import effective_properties, parse_models, read_models
from bert_serve_server.layout import DEFAULT_OUT, write_layout


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--models", help='"NAME[:VERSION]=DIR ..." (default: model_store/bert.mar)')
    args = parser.parse_args()
    models = None
    if args.models:
        store = Path(effective_properties()["model_store"])
        models, refused = package_models(parse_models(args.models), store, read_models())
        for key, why in refused.items():
            print(f"model {key} refused: {why}", file=sys.stderr)
        if models is None or refused:
            return 1
    out = write_layout(args.out.resolve(), models=models)
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        print(path.relative_to(out))
    print(f"layout written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
