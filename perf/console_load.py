"""What an open web console costs the engine (the console's budget: no request it makes costs the
engines measurable speed), for `make bench` and alone (`python -m perf.console_load` on the testbed
that is up).

Method. The cluster serves the testbed profile (TP=2 over Ray on the pair) and the gateway runs on
the head with the bench's client key and an admin key of its own (`gateway keys add --admin`). Per
repetition, interleaved (the order alternates), one window of WINDOW_S with no console open and one
with a console open, each under eight requests in flight (perf/load.py: 64 tokens each with
ignore_eos), the engine's generated tokens a second read from its own counter at both ends. "Open"
is what a browser on the console holds: signed in with the admin key, the cluster page loaded and
its live stream (`/console/live`, a look at every head agent's report and `/metrics` each second)
held, and the model page's stream (`/console/live/model/NAME`, the engine's own `/metrics` each
second) beside it, each opened again when the gateway ends it, as the browser's EventSource does; a
page load every RELOAD_S besides, as an owner clicking around would.

Figure: c8 throughput with the console open, its median against the spread of the windows with none
(met when it is at or above their minimum); the ratio of each repetition beside it.
"""

from __future__ import annotations

import statistics
import threading

import httpx

from perf import load, testbed
from perf.figures import Figure, info, say
from perf.session import PROFILE, standalone

WINDOW_S = 30.0
CONCURRENCY = 8
RELOAD_S = 5.0  # a page load this often while open, beside the two live streams
MIN_REPS = 5
GW_KEY = "gw-bench-console-key-3c9e"  # the bench's client key (test scaffolding)
ADMIN = "bench-console"  # the admin key's name the bench adds, and revokes at the end


class Console:
    """A browser's worth of console traffic until stopped: two live streams held, a page now and then."""

    def __init__(self, base: str, key: str, model: str):
        self.base, self.key, self.model = base, key, model
        self.events, self.pages, self.failures = 0, 0, 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.client = httpx.Client(base_url=base, timeout=30)

    def sign_in(self) -> None:
        r = self.client.post("/console/login", data={"key": self.key}, follow_redirects=False)
        if r.status_code != 303 or not self.client.cookies:
            raise SystemExit(f"bench: the console refused the admin key ({r.status_code}): {r.text[:200]}")

    def _stream(self, path: str) -> None:
        while not self._stop.is_set():
            try:
                with self.client.stream("GET", path, timeout=httpx.Timeout(30, read=60)) as r:
                    if r.status_code != 200:
                        self.failures += 1
                        self._stop.wait(1.0)
                        continue
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            self.events += 1
                        if self._stop.is_set():
                            return
            except httpx.HTTPError:
                self.failures += 1
                self._stop.wait(1.0)

    def _pages(self) -> None:
        while not self._stop.wait(RELOAD_S):
            for path in ("/console", f"/console/model/{self.model}"):
                try:
                    ok = self.client.get(path).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.pages += ok
                self.failures += not ok

    def __enter__(self) -> Console:
        self._stop.clear()  # opened again for each window: the last window's close set it
        targets = [
            (self._stream, "/console/live"),
            (self._stream, f"/console/live/model/{self.model}"),
            (self._pages, None),
        ]
        self._threads = [
            threading.Thread(target=fn, args=(() if arg is None else (arg,)), daemon=True) for fn, arg in targets
        ]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=70)


def measure(s) -> None:
    """Console open against none, interleaved; the gateway and the admin key taken away at the end."""
    if not s.serving():
        s.sc("up", "--profile", PROFILE, timeout=900)
    s.sc.env["GATEWAY_API_KEYS"] = GW_KEY
    gw = f"http://{testbed.lan_ip('spark-head')}:4000"
    model = s.prof.served_model_name
    s.sc("gateway", "keys", "revoke", ADMIN, check=False)
    s.sc("gateway", "up", timeout=300)
    key = s.sc("gateway", "keys", "add", ADMIN, "--admin").stdout.strip().splitlines()[-1]
    reps = max(s.reps, MIN_REPS)
    try:
        console = Console(gw, key, model)
        console.sign_in()
        for i in range(reps):
            got = {}
            for open_ in (False, True) if i % 2 == 0 else (True, False):
                if open_:
                    seen = console.events
                    with console:
                        got[open_] = load.throughput(s.endpoint, model, WINDOW_S, concurrency=CONCURRENCY)
                    if console.events - seen < WINDOW_S / 2:  # a live event a second on each of two streams
                        raise SystemExit(
                            f"bench: the console's streams sent {console.events - seen} events in an open "
                            f"window of {WINDOW_S:g}s: that window measured no console"
                        )
                else:
                    got[open_] = load.throughput(s.endpoint, model, WINDOW_S, concurrency=CONCURRENCY)
            s.rec("console_tput_open", got[True])
            s.rec("console_tput_none", got[False])
            s.rec("console_tput_ratio", got[True] / got[False])
            say(f"console {i + 1}/{reps}: open {got[True]:.1f} tok/s, none {got[False]:.1f} tok/s")
        s.details["console_traffic"] = {
            "live_events": console.events,
            "pages": console.pages,
            "failures": console.failures,
        }
        if not console.events or console.failures:
            raise SystemExit(
                f"bench: the console's traffic did not hold ({console.events} live events, "
                f"{console.failures} failures): the open windows measured no console"
            )
    finally:
        s.sc("gateway", "keys", "revoke", ADMIN, check=False)
        s.sc("gateway", "down", check=False)


def figures(R: dict) -> list[Figure]:
    if not R.get("console_tput_ratio"):
        return []
    none, opened = R["console_tput_none"], R["console_tput_open"]
    return [
        Figure(
            "console_throughput",
            f"c{CONCURRENCY} throughput with a console open (two live streams, a page every {RELOAD_S:g}s)",
            "tok/s",
            f">= {min(none):.1f} (the slowest window with none)",
            opened,
            statistics.median(opened) >= min(none),
        ),
        info("console_tput_none", f"  ... c{CONCURRENCY} throughput with no console open", "tok/s", none),
        info("console_tput_ratio", "  ... open / none, per repetition (interleaved)", "ratio", R["console_tput_ratio"]),
    ]


def main(argv: list[str] | None = None) -> int:
    return standalone(
        "console_load",
        "What an open web console costs the engine: c8 throughput with a console open against none.",
        measure,
        figures,
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
