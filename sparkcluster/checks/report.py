"""Rendering check results: a table (row per check, column per node), then cause and fix lines."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from sparkcluster import redact
from sparkcluster.checks import Result, titles
from sparkcluster.errors import EXIT_FAILED, failure, problem

STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def table(results: list[Result], nodes: list[str], console: Console) -> None:
    by_id: dict[str, dict[str, Result]] = {}
    for r in results:
        for node in r.node.split("+"):  # a result of several nodes (a+b: the fabric's bandwidth) in each column
            by_id.setdefault(r.id, {})[node] = r
    names = titles()
    # ids and statuses never shrink; the titles are shown only where the terminal has room
    id_w = max(len(c) for c in by_id) if by_id else 5
    node_w = [max(len(n), 4) for n in nodes]
    room = console.width - id_w - sum(node_w) - 2 * (len(nodes) + 1)
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    t.add_column("check", no_wrap=True, min_width=id_w)
    for n, w in zip(nodes, node_w):
        t.add_column(n, no_wrap=True, min_width=w)
    show_titles = room >= 20
    if show_titles:
        t.add_column("", style="dim", no_wrap=True, overflow="ellipsis", max_width=room)
    for cid, row in by_id.items():
        cells = []
        for n in nodes:
            r = row.get(n)
            cells.append(f"[{STYLE[r.status]}]{r.status.upper()}[/]" if r else "")
        t.add_row(cid, *cells, *([names.get(cid, "")] if show_titles else []))
    console.print(t)
    problems = [r for r in results if r.status in ("warn", "fail")]
    if problems:
        console.print()
    for r in problems:
        console.print(
            f"[{STYLE[r.status]}]{r.status.upper()}[/] {r.id} on {r.node}: {redact.mask(r.detail)}",
            highlight=False,
            soft_wrap=True,
        )
        if r.fix:
            console.print(f"     fix: {redact.mask(r.fix)}", highlight=False, soft_wrap=True)


def as_json(results: list[Result], exit_code: int = EXIT_FAILED) -> str:
    """`ok` and every check; a failed one adds the failure shape every `--json` shares (errors.failure),
    a problem per failed check and node (an unreachable node's own)."""
    failed = [r for r in results if r.status == "fail"]
    doc: dict = {"ok": not failed, "checks": [r.as_json() for r in results]}
    if failed:
        nodes = ", ".join(dict.fromkeys(r.node for r in failed))
        fix = next((r.fix for r in failed if r.fix), None)
        problems = [problem(r.node, f"{r.id}: {r.detail}", r.fix or None) for r in failed]
        doc = {**failure(f"{len(failed)} check(s) failed on {nodes}", fix, problems, exit_code), **doc}
    return redact.mask(json.dumps(doc, indent=2))
