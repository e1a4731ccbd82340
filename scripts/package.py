"""Package a model folder as a .mar: ``python -m bert_serve_server package`` under its old name.

python scripts/package.py --model-dir build/bert-sentiment
"""

import sys

from bert_serve_server.__main__ import main

sys.exit(main(["package", *sys.argv[1:]]))
