"""Teardown's outcomes are values: what became of the server, what was removed, what failed."""

from __future__ import annotations

import docker.errors
import pytest

from sparkcluster.deployment import server, teardown
from sparkcluster.node import contract


class API:
    """A head container whose supervisor stops the server `lag` looks after it is disabled (None:
    never, as when the agent is wedged itself)."""

    def __init__(self, running=True, record=None, alive=True, present=True, lag: int | None = 1):
        self.running, self.record, self.alive, self.present, self.lag = running, record, alive, present, lag
        self.removed: list[str] = []
        self.disabled = False
        self.execs: list[list[str]] = []
        self._last: list[str] = []

    def inspect_container(self, name):
        if not self.present:
            raise docker.errors.NotFound("no such container")
        return {"State": {"Running": self.running}}

    def exec_create(self, container, cmd, **kw):
        self.execs.append(cmd)
        self._last = cmd
        return {"Id": str(len(self.execs))}

    def exec_start(self, exec_id, **kw):
        cmd = self._last
        if cmd[:2] == ["rm", "-f"]:
            self.disabled = True
        elif cmd[:2] == ["sh", "-c"] and "kill -TERM" in cmd[2]:
            self.alive = False
            return b"killed\n"
        return b""

    def exec_inspect(self, exec_id):
        cmd = self._last
        if cmd[:3] == ["sh", "-c", 'kill -0 "$1"']:
            if self.disabled and self.lag is not None:
                self.lag -= 1
                if self.lag < 0:
                    self.alive = False
            return {"ExitCode": 0 if self.alive else 1}
        return {"ExitCode": 0}

    def remove_container(self, cid, force=False):
        if not self.present:
            raise docker.errors.NotFound("gone")
        self.removed.append(cid)


class Host:
    name = "spark-head"

    def __init__(self, api):
        self.api = api

    def docker(self):
        return type("C", (), {"api": self.api})()


REC = server.Record(pid=4242, exec_id="", profile="testbed", model="m", port=8000, started_at=0.0, container="c")


@pytest.fixture
def with_record(monkeypatch):
    monkeypatch.setattr(server, "read_record", lambda api, c: api.record)


def test_stop_server_outcomes(with_record):
    assert teardown.stop_server(Host(API(present=False)), "c").how is teardown.Stop.NO_CONTAINER
    assert teardown.stop_server(Host(API(running=False)), "c").how is teardown.Stop.CONTAINER_NOT_RUNNING
    assert teardown.stop_server(Host(API(record=None)), "c").how is teardown.Stop.NO_RECORD
    gone = teardown.stop_server(Host(API(record=REC, alive=False)), "c")
    assert gone.how is teardown.Stop.NOT_RUNNING and not gone.stopped
    api = API(record=REC)
    out = teardown.stop_server(Host(api), "c")
    assert out.stopped and out.pid == 4242 and str(out) == "vllm serve (pid 4242) stopped"
    # the supervisor is told first, so it never brings the stopped server back
    assert api.execs[0] == ["rm", "-f", contract.DESIRED_PATH, contract.SECRETS_PATH, contract.WAKE_PATH]
    assert not any(c[:2] == ["sh", "-c"] and "kill -TERM" in c[2] for c in api.execs)


def test_a_server_the_supervisor_does_not_stop_is_killed_by_pid(with_record):
    api = API(record=REC, lag=None)
    out = teardown.stop_server(Host(api), "c", grace=0.5)
    assert out.stopped and out.detail == "killed" and api.disabled
    assert api.execs[-1] == ["sh", "-c", teardown.kill_command(4242, 5.0)]


def test_remove_container_by_id_tolerates_gone():
    api = API()
    assert teardown.remove_container(Host(api), "abc") and api.removed == ["abc"]
    assert not teardown.remove_container(Host(API(present=False)), "abc")


def test_remove_shm_command_only_ever_names_our_segments():
    import subprocess

    import pytest

    from sparkcluster.deployment.teardown import SHM_SEGMENTS, remove_shm_command

    assert remove_shm_command(["/dev/shm/psm_18a7fb82"]) == ["rm", "-f", "--", "/dev/shm/psm_18a7fb82"]
    for hostile in (
        "/dev/shm/psm_x; rm -rf /",
        "/dev/shm/../etc/passwd",
        "/dev/shm/psm_$(id)",
        "/tmp/psm_1",
        "/dev/shm/psm_1\n/etc/shadow",
        "-rf",
    ):
        with pytest.raises(ValueError):
            remove_shm_command([hostile])
    # the listing script runs as it is in any POSIX shell, with nothing to list
    assert subprocess.run(["sh", "-c", SHM_SEGMENTS], capture_output=True, timeout=10).returncode == 0


def test_a_disable_that_fails_in_the_container_fails_loudly(with_record):
    """Issue 23: `disable` is what stops the supervisor bringing a server back; an exec that exits
    non-zero (a read-only /etc, the file busy) is a failure naming the node and the command, never a
    quiet "stopped"."""
    from sparkcluster.errors import CommandFailed

    class Stuck(API):
        def exec_inspect(self, exec_id):
            return {"ExitCode": 1} if self._last[:2] == ["rm", "-f"] else super().exec_inspect(exec_id)

    api = Stuck(record=REC)
    with pytest.raises(CommandFailed, match=r"command failed \(exit 1\): docker exec c rm -f"):
        server.disable(api, "c")


def test_the_variable_probe_fails_as_a_failed_exec_not_as_missing_variables():
    from types import SimpleNamespace

    from sparkcluster.errors import CommandFailed
    from sparkcluster.up.stages import probe

    class NoEnv(API):
        def exec_start(self, exec_id, **kw):
            return b"OCI runtime exec failed: exec failed: unable to start container process\n"

        def exec_inspect(self, exec_id):
            return {"ExitCode": 126}

    r = SimpleNamespace(cluster=SimpleNamespace(hosts={"spark-worker": Host(NoEnv())}))
    with pytest.raises(CommandFailed, match="exit 126") as e:
        probe.env_in_container(r, "spark-worker", "c")
    assert "OCI runtime exec failed" in "\n".join(e.value.details)


def test_a_deployments_teardown_leaves_the_gateway_and_down_of_everything_removes_it(monkeypatch):
    """Issue 36: `down --node X` leaves the gateway routing the rest; `down` removes it with the rest."""
    from sparkcluster.labels import GATEWAY_ROLE, ROLE_LABEL

    listed = [
        {"Id": "head1", "Names": ["/sparkcluster-x-head"], "Labels": {ROLE_LABEL: "head"}},
        {"Id": "gw1", "Names": ["/sparkcluster-x-gateway"], "Labels": {ROLE_LABEL: GATEWAY_ROLE}},
    ]
    monkeypatch.setattr(teardown, "ours", lambda host, cluster: listed)
    api = API()
    assert teardown.remove_containers(Host(api), "x") == ["sparkcluster-x-head"] and api.removed == ["head1"]
    api = API()
    assert teardown.remove_containers(Host(api), "x", gateway=True) == ["sparkcluster-x-head", "sparkcluster-x-gateway"]


def test_down_of_one_deployment_leaves_the_one_beside_it(monkeypatch):
    """Two deployments on one node (issue 60): `down --profile` of the later slot's stops its own
    server and removes its own container, never the first slot's."""
    from conftest import make_inventory

    from sparkcluster.labels import ROLE_LABEL, SLOT_LABEL
    from sparkcluster.remote.fanout import ConnectedHosts

    listed = [
        {"Id": "first", "Names": ["/sparkcluster-pair-head"], "Labels": {ROLE_LABEL: "head"}, "State": "running"},
        {
            "Id": "later",
            "Names": ["/sparkcluster-pair-d1-head"],
            "Labels": {ROLE_LABEL: "head", SLOT_LABEL: "1"},
            "State": "running",
        },
    ]
    stopped, removed = [], []
    monkeypatch.setattr(teardown, "ours", lambda host, cluster: listed)
    monkeypatch.setattr(teardown, "shm_segments", lambda host, cid: [])
    monkeypatch.setattr(teardown, "stop_server", lambda host, cid: stopped.append(cid))
    monkeypatch.setattr(teardown, "remove_container", lambda host, cid: removed.append(cid) or True)
    inv = make_inventory().only(["spark-head"]).at_slot(1)
    host = Host(API())
    host.close = lambda: None
    out = teardown.down(ConnectedHosts(inv, {"spark-head": host}), only_ids={"spark-head": {"later"}})
    assert stopped == ["later"] and removed == ["later"]
    assert out["spark-head"].removed == ["sparkcluster-pair-d1-head"]


def test_down_of_a_service_removes_both_its_containers_and_asks_neither_for_shared_memory(monkeypatch):
    """A service's two containers (its supervisor, its own from an image that may have no shell): `down
    --profile` removes both; neither is exec'd into for a rank's /dev/shm segments, nor stopped as an
    engine."""
    from conftest import make_inventory

    from sparkcluster.labels import ROLE_LABEL, SERVER_ROLE, SERVICE_ROLE, SLOT_LABEL
    from sparkcluster.remote.fanout import ConnectedHosts

    listed = [
        {"Id": "sup", "Names": ["/s-d1-service-spark-head"], "Labels": {ROLE_LABEL: SERVICE_ROLE, SLOT_LABEL: "1"}},
        {
            "Id": "srv",
            "Names": ["/s-d1-service-spark-head-server"],
            "Labels": {ROLE_LABEL: SERVER_ROLE, SLOT_LABEL: "1"},
        },
    ]
    for c in listed:
        c["State"] = "running"
    asked, stopped, removed = [], [], []
    monkeypatch.setattr(teardown, "ours", lambda host, cluster: listed)
    monkeypatch.setattr(teardown, "shm_segments", lambda host, cid: asked.append(cid) or [])
    monkeypatch.setattr(teardown, "stop_server", lambda host, cid: stopped.append(cid))
    monkeypatch.setattr(teardown, "remove_container", lambda host, cid: removed.append(cid) or True)
    inv = make_inventory().only(["spark-head"]).at_slot(1)
    host = Host(API())
    host.close = lambda: None
    teardown.down(ConnectedHosts(inv, {"spark-head": host}), only_ids={"spark-head": {"sup", "srv"}})
    assert asked == [] and stopped == [] and sorted(removed) == ["srv", "sup"]
