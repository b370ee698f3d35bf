"""Teardown's outcomes are values: what became of the server, what was removed, what failed."""

from __future__ import annotations

import docker.errors
import pytest

from sparkcluster import serve, teardown
from sparkcluster.errors import CommandFailed
from sparkcluster.ssh import CommandResult


class API:
    def __init__(self, running=True, record=None, exec_running=True, present=True):
        self.running, self.record, self.exec_running, self.present = running, record, exec_running, present
        self.removed: list[str] = []

    def inspect_container(self, name):
        if not self.present:
            raise docker.errors.NotFound("no such container")
        return {"State": {"Running": self.running}}

    def exec_inspect(self, exec_id):
        return {"Running": self.exec_running}

    def remove_container(self, cid, force=False):
        if not self.present:
            raise docker.errors.NotFound("gone")
        self.removed.append(cid)


class Host:
    name = "spark-head"

    def __init__(self, api, kill_exit=0):
        self.api, self.kill_exit, self.ran = api, kill_exit, []

    def docker(self):
        return type("C", (), {"api": self.api})()

    def run(self, cmd, timeout=30.0, stdin=None, warn=False):
        self.ran.append(cmd)
        res = CommandResult(self.name, cmd, self.kill_exit, "stopped\n" if self.kill_exit == 0 else "", "", 0.1)
        if not res.ok and not warn:
            raise CommandFailed(res)
        return res


REC = serve.Record(pid=4242, exec_id="e1", profile="testbed", model="m", port=8000, started_at=0.0)


@pytest.fixture
def with_record(monkeypatch):
    monkeypatch.setattr(serve, "read_record", lambda api, c: api.record)


def test_stop_server_outcomes(with_record):
    assert teardown.stop_server(Host(API(present=False)), "c").how is teardown.Stop.NO_CONTAINER
    assert teardown.stop_server(Host(API(running=False)), "c").how is teardown.Stop.CONTAINER_NOT_RUNNING
    assert teardown.stop_server(Host(API(record=None)), "c").how is teardown.Stop.NO_RECORD
    gone = teardown.stop_server(Host(API(record=REC, exec_running=False)), "c")
    assert gone.how is teardown.Stop.NOT_RUNNING and not gone.stopped
    host = Host(API(record=REC))
    out = teardown.stop_server(host, "c")
    assert out.stopped and out.pid == 4242 and str(out) == "vllm serve (pid 4242) stopped"
    assert host.ran == [teardown.kill_command(4242, teardown.STOP_GRACE_S)]


def test_a_failed_kill_is_loud(with_record):
    with pytest.raises(CommandFailed):
        teardown.stop_server(Host(API(record=REC), kill_exit=1), "c")


def test_remove_container_by_id_tolerates_gone():
    api = API()
    assert teardown.remove_container(Host(api), "abc") and api.removed == ["abc"]
    assert not teardown.remove_container(Host(API(present=False)), "abc")


def test_remove_shm_command_only_ever_names_our_segments():
    import subprocess

    import pytest

    from sparkcluster.teardown import SHM_SEGMENTS, remove_shm_command

    assert remove_shm_command(["/dev/shm/psm_18a7fb82"]) == ["rm", "-f", "--", "/dev/shm/psm_18a7fb82"]
    for hostile in ("/dev/shm/psm_x; rm -rf /", "/dev/shm/../etc/passwd", "/dev/shm/psm_$(id)", "/tmp/psm_1",
                    "/dev/shm/psm_1\n/etc/shadow", "-rf"):
        with pytest.raises(ValueError):
            remove_shm_command([hostile])
    # the listing script runs as it is in any POSIX shell, with nothing to list
    assert subprocess.run(["sh", "-c", SHM_SEGMENTS], capture_output=True, timeout=10).returncode == 0
