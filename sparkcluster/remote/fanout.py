"""Run one function per host in parallel; collect per-host outcomes as values.

Like fabric's GroupResult: a failure on one host does not hide the others' results, and the caller
decides whether a stage fails as a whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sparkcluster.config.inventory import Inventory, Node
from sparkcluster.errors import CommandFailed, ConnectError, SparkError, StageError, StepFailure
from sparkcluster.remote import ssh

K = TypeVar("K")
T = TypeVar("T")


@dataclass(frozen=True)
class HostOutcome(Generic[T]):
    host: str
    value: T | None = None
    error: BaseException | None = None
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class GroupResult(dict[str, HostOutcome[T]]):
    @property
    def succeeded(self) -> dict[str, T]:
        return {h: o.value for h, o in self.items() if o.ok}

    @property
    def failed(self) -> dict[str, BaseException]:
        return {h: o.error for h, o in self.items() if not o.ok}

    def values_or_raise(self, stage: str) -> dict[str, T]:
        """Every host's value, or a StageError naming each host that failed."""
        if not self.failed:
            return self.succeeded
        failures: list[StepFailure] = []
        for host, err in self.failed.items():
            if isinstance(err, StageError):
                failures.extend(err.failures)
            elif isinstance(err, CommandFailed):
                r = err.result
                failures.append(StepFailure(host, stage, err.reason, r.command, r.tail(), err.fix))
            elif isinstance(err, SparkError):
                failures.append(StepFailure(host, stage, err.message, fix=err.fix))
            else:
                raise err  # a bug, not a host's failure: let the CLI log the traceback
        raise StageError(stage, failures)


def run_each(items: Iterable[tuple[str, K]], fn: Callable[[K], T], max_workers: int | None = None) -> GroupResult[T]:
    pairs = list(items)
    result: GroupResult[T] = GroupResult()
    if not pairs:
        return result

    def one(name: str, item: K) -> HostOutcome[T]:
        started = time.monotonic()
        try:
            return HostOutcome(name, fn(item), None, time.monotonic() - started)
        except BaseException as e:  # noqa: BLE001 - the outcome carries it to the caller
            if isinstance(e, KeyboardInterrupt):
                raise
            return HostOutcome(name, None, e, time.monotonic() - started)

    # daemon threads, not a pool: Ctrl-C ends the wait at once and the process exits without
    # joining a thread still blocked on a silent host (a pool's workers are joined at exit)
    outcomes: dict[int, HostOutcome[T]] = {}
    done = threading.Condition()
    slots = threading.Semaphore(max_workers or len(pairs))

    def worker(i: int, name: str, item: K) -> None:
        with slots:
            try:
                o = one(name, item)
            except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt in a worker: the host's outcome
                o = HostOutcome(name, None, e)
        with done:
            outcomes[i] = o
            done.notify()

    for i, (name, item) in enumerate(pairs):
        threading.Thread(target=worker, args=(i, name, item), daemon=True, name=f"fanout-{name}").start()
    with done:
        while len(outcomes) < len(pairs):
            done.wait(0.5)
    for i in range(len(pairs)):
        result[outcomes[i].host] = outcomes[i]
    return result


class Background(Generic[T]):
    """One call on a daemon thread, its value (or error) read later with `result()`: for a wait
    that must not hold up Ctrl-C or the process's exit (a pool's workers are joined at exit)."""

    def __init__(self, fn: Callable[..., T], *args) -> None:
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn, *args), daemon=True, name="background").start()

    def _run(self, fn: Callable[..., T], *args) -> None:
        try:
            self._value = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to whoever reads the result
            self._error = e
        self._done.set()

    def result(self) -> T:
        while not self._done.wait(0.5):
            pass
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


def unreachable_error(failed: dict[str, BaseException]) -> BaseException:
    """The connection failures of several nodes as one error naming each of them, with each one's
    fix (they differ: another port, another key); one node's failure as it is. A bug stays a bug."""
    errors = list(failed.values())
    if len(errors) == 1 or not all(isinstance(e, SparkError) for e in errors):
        return next((e for e in errors if not isinstance(e, SparkError)), errors[0])
    if not all(isinstance(e, ConnectError) for e in errors):
        try:
            GroupResult({h: HostOutcome(h, None, e) for h, e in failed.items()}).values_or_raise("connect")
        except StageError as stage:
            return stage
    names = ", ".join(failed)
    fixes = "; ".join(dict.fromkeys(e.fix for e in errors if e.fix))
    err = ConnectError(names, f"{len(errors)} nodes could not be reached", fixes, details=[e.message for e in errors])
    err.problems = [p for e in errors for p in e.problems]
    return err


def connect_all(inv: Inventory, nodes: list[Node] | None = None) -> GroupResult[ssh.Host]:
    """Open one connection to each host, all at once."""
    settings = ssh.Settings.from_inventory(inv)
    targets = nodes if nodes is not None else inv.nodes
    return run_each(((n.name, n) for n in targets), lambda n: ssh.connect(n, settings))


def connect_reachable(inv: Inventory, nodes: list[Node] | None = None) -> tuple[ConnectedHosts, dict[str, SparkError]]:
    """Connect to every node at once and go on with those that answer: for the commands that
    report on (or clean) what they can reach. An unreachable node is a value; a bug still raises."""
    res = connect_all(inv, nodes)
    bugs = [e for e in res.failed.values() if not isinstance(e, SparkError)]
    if bugs:
        for h in res.succeeded.values():
            h.close()
        raise bugs[0]
    return ConnectedHosts(inv, res.succeeded), dict(res.failed)


class ConnectedHosts:
    """The connected hosts of one invocation; closes them all on exit."""

    def __init__(self, inv: Inventory, hosts: dict[str, ssh.Host]):
        self.inventory = inv
        self.hosts = hosts

    @classmethod
    def connect(cls, inv: Inventory, nodes: list[Node] | None = None) -> ConnectedHosts:
        """Every node (or `nodes`) connected, or an error naming each that is not."""
        res = connect_all(inv, nodes)
        if res.failed:
            for h in res.succeeded.values():
                h.close()
            raise unreachable_error(res.failed)
        return cls(inv, {name: o.value for name, o in res.items()})

    @property
    def head(self) -> ssh.Host:
        return self.hosts[self.inventory.head.name]

    @property
    def workers(self) -> list[ssh.Host]:
        return [self.hosts[n.name] for n in self.inventory.workers if n.name in self.hosts]

    def each(self, fn: Callable[[ssh.Host], T], hosts: list[ssh.Host] | None = None) -> GroupResult[T]:
        targets = hosts if hosts is not None else list(self.hosts.values())
        return run_each(((h.name, h) for h in targets), fn)

    def close(self) -> None:
        for h in self.hosts.values():
            h.close()

    def __enter__(self) -> ConnectedHosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
