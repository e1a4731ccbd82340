"""Start, stop and ask one TorchServe: ``python -m bert_serve_server`` under its old name.

python scripts/torchserve_ctl.py start [--state-dir .run]
"""

import sys

from bert_serve_server.__main__ import main

sys.exit(main(sys.argv[1:]))
