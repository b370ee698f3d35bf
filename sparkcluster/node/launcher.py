"""The container's entry point: `python3 /opt/sparkcluster CONFIG` runs this file as the
`__main__.py` beside the shipped `node/` package (standard library only)."""

import sys

from node.agent import main

sys.exit(main(*sys.argv[1:]))
