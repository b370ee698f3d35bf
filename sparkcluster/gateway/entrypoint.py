"""The gateway container's entry point: read the config (routes, keys: a 0600 file written through
the Docker API, never argv), serve it with uvicorn. On SIGTERM (`gateway down`, `down`, a replaced
container) uvicorn stops taking connections and lets the requests in flight finish for `drain_s`
before it cancels them; the container's stop timeout is a little longer (rollout.py). What a peer
may hold of it (deadlines, connection caps, the head's size) is gateway/exposure's, passed as far as
the image's uvicorn takes it."""

from __future__ import annotations

import json
import sys

CONFIG_PATH = "/etc/sparkcluster/gateway.json"


def main(config_path: str = CONFIG_PATH) -> int:
    import uvicorn

    from . import exposure
    from .app import Gateway

    with open(config_path) as f:
        cfg = json.load(f)
    gw = Gateway(cfg, config_path)
    tls = cfg.get("tls") or {}
    uvicorn.run(
        gw.app(),
        host=cfg.get("host", "0.0.0.0"),
        port=int(cfg["port"]),
        timeout_graceful_shutdown=int(cfg.get("drain_s", 30)),
        log_level="warning",
        access_log=False,  # one line per request would drown the gateway's journal
        ssl_certfile=tls.get("cert"),
        ssl_keyfile=tls.get("key"),
        **exposure.server_options(gw.guard),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
