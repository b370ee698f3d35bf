"""`status --watch` as a full-screen view (Textual): per deployment its state, problems and a
sparkline of tokens per second; per node its MemAvailable and headroom above the profile's memory
floor, with a sparkline of the headroom; the supervisor journal's last entries. Every refresh is one
`status` round trip (status/status.collect_all), run off the screen's thread so the view never stalls.

Why here and not in the monitoring stack: it needs nothing running beyond what `status` reads (no
Prometheus), and its history is the refreshes it has seen (a minute or two at the default 2 s).
Textual is imported only by this module, only when `--watch` runs on a terminal."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.css.query import NoMatches
from textual.widgets import Footer, Header, Label, RichLog, Sparkline

from sparkcluster.deployment import supervision
from sparkcluster.node import contract
from sparkcluster.status.status import ClusterStatus, supervisor_shown

KEEP = 90  # refreshes of history per sparkline
JOURNAL_LINES = 12


def _id(text: str) -> str:
    return "w-" + re.sub(r"[^a-zA-Z0-9_-]", "_", text)


def floor_gib(st: ClusterStatus) -> float | None:
    rec = contract.Supervised.of(st.supervisor)
    policy = (rec.policy if rec else None) or {}
    return float(policy["memory_floor_gib"]) if "memory_floor_gib" in policy else None


def readings(sts: list[ClusterStatus]) -> dict[str, tuple[str, float | None]]:
    """What one refresh adds to each sparkline: key -> (the line beside it, the value)."""
    out: dict[str, tuple[str, float | None]] = {}
    for st in sts:
        name = st.deployment or st.cluster
        rec = contract.Supervised.of(st.supervisor)
        tok = rec.tokens_per_s if rec else None
        problems = f"  {'; '.join(st.problems)}" if st.problems else ""
        sup = supervisor_shown(st.supervisor)
        line = f"{name}  {st.state.upper()}  supervisor: {sup}  tok/s: {'-' if tok is None else f'{tok:.1f}'}{problems}"
        out[f"tok {name}"] = (line, tok)
        floor = floor_gib(st)
        for n in st.nodes:
            if f"mem {n.node}" in out:
                continue
            avail = n.mem_available_gib
            head = None if avail is None or floor is None else avail - floor
            text = f"  {n.node}  {n.state}  MemAvailable {'-' if avail is None else f'{avail:.1f}'} GiB"
            text += "" if head is None else f"  headroom {head:.1f} GiB"
            out[f"mem {n.node}"] = (text, head if head is not None else avail)
    return out


class LiveView(App):
    """The view; `collect` is one status round trip (status/status.collect_all bound to the inventory)."""

    TITLE = "sparkcluster status --watch"
    # Ctrl-C ends the watch as it ends any command (README: exit 130), not Textual's "press ctrl+q"
    BINDINGS = [("q", "quit", "Quit"), Binding("ctrl+c", "interrupt", show=False, priority=True)]  # noqa: RUF012
    CSS = """
    .row { height: 3; }
    .row Label { width: 1fr; content-align: left middle; }
    .row Sparkline { width: 40; margin: 1 1; }
    #journal { height: 14; border: round $primary; }
    """

    def __init__(self, collect: Callable[[], list[ClusterStatus]], interval: float = 2.0):
        super().__init__()
        self.collect, self.interval = collect, interval
        self.history: dict[str, deque[float]] = {}
        self.refreshes = 0
        self._busy = False
        self.last: list[ClusterStatus] | None = None  # what the view showed last: q's exit follows it
        self.interrupted = False  # left by Ctrl-C

    def action_interrupt(self) -> None:
        self.interrupted = True
        self.exit()

    def compose(self) -> ComposeResult:
        yield Header(show_clock=True)
        yield VerticalScroll(id="rows")
        yield RichLog(id="journal", max_lines=200, wrap=False)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#journal", RichLog).border_title = "the supervisor's journal"
        self.tick()
        self.set_interval(self.interval, self.tick)

    def tick(self) -> None:
        if self._busy:
            return
        self._busy = True
        self.run_worker(self._collect, thread=True, exclusive=True)

    def _collect(self) -> None:
        try:
            sts = self.collect()
        except Exception as e:  # noqa: BLE001 - the view stays up and says why
            self.call_from_thread(self.notify, f"status failed: {e}", severity="error")
            sts = None
        self.call_from_thread(self.show, sts)

    def show(self, sts: list[ClusterStatus] | None) -> None:
        self._busy = False
        if sts is None:
            return
        self.last = sts
        try:
            rows = self.query_one("#rows", VerticalScroll)
            log = self.query_one("#journal", RichLog)
        except NoMatches:  # a refresh that ended after `q`: the screen is already taken down
            return
        self.refreshes += 1
        for key, (text, value) in readings(sts).items():
            h = self.history.setdefault(key, deque(maxlen=KEEP))
            if value is not None:
                h.append(float(value))
            wid = _id(key)
            found = rows.query(f"#{wid}")
            if not found:
                rows.mount(
                    Horizontal(
                        Label(text, id=f"{wid}-label"), Sparkline(list(h), id=f"{wid}-spark"), id=wid, classes="row"
                    )
                )
            else:
                self.query_one(f"#{wid}-label", Label).update(text)
                self.query_one(f"#{wid}-spark", Sparkline).data = list(h)
        log.clear()
        for st in sts:
            for e in st.journal[-JOURNAL_LINES:]:
                log.write(supervision.format_entry(e))


def run(collect: Callable[[], list[ClusterStatus]], interval: float) -> list[ClusterStatus] | None:
    """The view until the user quits it with q: what it showed last (None before any answer). Ctrl-C
    raises KeyboardInterrupt, as it would anywhere else."""
    app = LiveView(collect, interval)
    app.run()
    if app.interrupted:
        raise KeyboardInterrupt
    return app.last
