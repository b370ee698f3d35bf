"""Inside the gateway's container: its own /gateway/status (gateway/app), asked with one of its
keys, which are read there from its config (argv[1]), never carried on a command line. Printed as
the gateway answered it."""

import json
import ssl
import sys
import urllib.request


def main(argv):
    with open(argv[1]) as f:
        cfg = json.load(f)
    scheme = "https" if cfg.get("tls") else "http"
    ctx = ssl._create_unverified_context()  # its own certificate, on 127.0.0.1
    req = urllib.request.Request(
        f"{scheme}://127.0.0.1:{cfg['port']}/gateway/status",
        headers={"Authorization": "Bearer " + (cfg.get("keys") or [""])[0]},
    )
    print(urllib.request.urlopen(req, timeout=3, context=ctx).read().decode())


if __name__ == "__main__":
    main(sys.argv)
