"""python -m tests.testbed up|down|status"""

import argparse
import json
import sys

from .testbed import Testbed, TestbedError


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.testbed", description="two simulated DGX Sparks")
    ap.add_argument("command", choices=["up", "down", "status", "ray-image", "inventory"])
    ap.add_argument("--crossed", action="store_true", help="inventory: worker cabled in other ports")
    a = ap.parse_args(argv)
    tb = Testbed()
    try:
        if a.command == "up":
            tb.up()
            print(f"testbed up: ssh -F {tb.ssh_config} spark-head; inventory {tb.inventory}")
        elif a.command == "down":
            tb.down()
        elif a.command == "status":
            st = tb.status()
            print(json.dumps(st, indent=2))
            return 0 if st["state"] == "up" and not st["problems"] else 1
        elif a.command == "ray-image":
            print(tb.ray_image())
        elif a.command == "inventory":
            print(tb.inventory_text(crossed=a.crossed))
    except TestbedError as e:
        print(f"testbed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
