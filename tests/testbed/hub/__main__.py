"""python -m tests.testbed.hub --host IP --port N --model-dir DIR --state-dir DIR [--synthetic-mb N] [--scale-mb N]"""

import argparse
from pathlib import Path

from . import build_hub
from .server import make_server

ap = argparse.ArgumentParser(prog="python -m tests.testbed.hub")
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--port", type=int, default=3142)
ap.add_argument("--model-dir", type=Path, required=True)
ap.add_argument("--state-dir", type=Path, required=True)
ap.add_argument("--synthetic-mb", type=int, default=300)
ap.add_argument("--tiny-sha", default="")
ap.add_argument("--scale-mb", type=int, default=0)
# issue 52's 75 GB repository, sparse: hashed once on the first start (the memo), never downloaded
ap.add_argument("--large", action="store_true")
a = ap.parse_args()
srv = make_server(
    build_hub(
        a.model_dir,
        a.state_dir,
        synthetic_mb=a.synthetic_mb,
        tiny_sha=a.tiny_sha or None,
        scale_mb=a.scale_mb,
        large=a.large,
    ),
    a.host,
    a.port,
)
print(f"testbed hub on http://{a.host}:{srv.server_address[1]}", flush=True)
srv.serve_forever()
