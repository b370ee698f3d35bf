"""Entry point of the `vllm` console script (test double; see package docstring)."""

from __future__ import annotations

import sys

from vllm_standin.arg_utils import parse_args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.subparser == "serve":
        from vllm_standin.api_server import run_server

        return run_server(args)
    print(f"vllm: the test double only implements `serve` (got {args.subparser!r})", file=sys.stderr)
    return 2
