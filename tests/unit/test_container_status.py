"""What `status` reads inside a container (node/container_status): the one script the agent runs
for `/status` and `docker exec` runs where no agent answers it, the agent's answer to the node
itself only, and the node script's choice between the two, run by a real shell against stand-in
`curl` and `docker` commands on PATH."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess

import pytest

from sparkcluster.facts.probes import split_sections
from sparkcluster.node import container_status
from sparkcluster.node.memreport import serve_reports
from sparkcluster.status import status
from tests.unit.conftest import make_inventory


def test_the_script_prints_the_heads_sections_and_says_it_is_whole():
    got = split_sections(container_status.read(head=True))
    assert set(got) == {"record", "alive", "supervisor", "journal", "canary", "nccl", "engine", container_status.WHOLE}
    assert got[container_status.WHOLE].rc == 0
    assert got["record"].rc != 0  # no server recorded on this machine: no PID to believe
    assert set(split_sections(container_status.read(head=False))) == {"nccl", "engine", container_status.WHOLE}


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _get(address: str, port: int, path: str, source: str) -> tuple[int, str]:
    """GET from `source`: the address the agent sees the caller at."""
    c = http.client.HTTPConnection(address, port, timeout=5, source_address=(source, 0))
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def test_the_agent_answers_status_to_its_own_node_only():
    """The journal's last lines are the node's own business: a peer gets the figures, not them."""
    address = "127.0.0.2"  # the report's address; a caller from 127.0.0.1 is another host to it
    port = _free_port(address)
    serve_reports(address, port, lambda: {"node": "n"}, status=lambda: "the readings\n")
    assert _get(address, port, "/status", address) == (200, "the readings\n")
    code, body = _get(address, port, "/status", "127.0.0.1")
    assert code == 403 and "this node only" in body
    assert _get(address, port, "/", "127.0.0.1")[0] == 200  # its peers' report is as it was


@pytest.fixture
def stand_ins(tmp_path):
    """`curl` and `docker` on PATH that log their calls and print what the test put beside them."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("curl", "docker"):
        (bin_ / name).write_text(
            f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/calls\n'
            f'case "$*" in *" ps "*|ps\\ *) cat {tmp_path}/{name}.ps 2>/dev/null;; '
            f'exec\\ *) sh -c "$5";; *) cat {tmp_path}/{name}.out 2>/dev/null;; esac\n'
        )
        (bin_ / name).chmod(0o755)
    return tmp_path


def _run_readings(tmp_path, node: str) -> tuple[dict, list[str]]:
    script = status.container_readings(make_inventory(), node)
    env = {**os.environ, "PATH": f"{tmp_path}/bin:{os.environ['PATH']}"}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30).stdout
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return split_sections(out), calls


def test_the_node_reads_its_agents_answer_and_execs_nothing(stand_ins):
    (stand_ins / "curl.out").write_text(container_status.read(head=True))
    got, calls = _run_readings(stand_ins, "spark-head")
    assert "record" in got and "nccl" in got
    assert [c.split()[0] for c in calls] == ["curl"]
    assert "--noproxy *" in calls[0] and "http://198.19.2.1:8297/status" in calls[0]


@pytest.mark.parametrize(
    "answer",
    [
        "",  # no agent answers (connection refused)
        '{"node": "spark-head", "mem_available": 1}',  # an earlier agent: its report, whatever the path
        container_status.read(head=True).split(f"@@sc@@ {container_status.WHOLE}")[0],  # cut short
    ],
    ids=["none", "earlier-agent", "cut-short"],
)
def test_without_a_whole_answer_the_same_script_runs_by_docker_exec_in_our_container(stand_ins, answer):
    (stand_ins / "curl.out").write_text(answer)
    (stand_ins / "docker.ps").write_text("sparkcluster-pair-gateway\nsparkcluster-pair-head\n")
    got, calls = _run_readings(stand_ins, "spark-head")
    assert {"record", "alive", "supervisor", "journal", "canary", "nccl"} <= set(got)
    execs = [c for c in calls if c.startswith("docker") and " exec " in c]
    assert len(execs) == 1 and "sparkcluster-pair-head sh -c" in execs[0]  # never the gateway's
    # a worker's container gets the worker's script
    (stand_ins / "calls").unlink()
    (stand_ins / "docker.ps").write_text("sparkcluster-pair-worker-spark-worker\n")
    got, _ = _run_readings(stand_ins, "spark-worker")
    assert set(got) == {"nccl", "engine", container_status.WHOLE}


def test_no_container_of_ours_runs_no_sections(stand_ins):
    got, calls = _run_readings(stand_ins, "spark-head")
    assert got == {} and any(" ps " in c for c in calls)


def test_the_agents_answer_is_parsed_as_the_execs_was(monkeypatch):
    """One script, one parser: `_one` reads the agent's answer into the head's view."""
    from tests.unit.test_status import MEMINFO, _Host, _printed

    rec = json.dumps({"pid": os.getpid(), "started_at": 1.0})
    answer = (
        _printed(record=(rec, 0), alive=("", 0), supervisor=('{"state": "serving", "updated": 1.0}', 0))
        + "\n"
        + _printed(journal=('{"ts": 1.0, "event": "state: serving"}', 0), nccl=("NCCL INFO x", 0), whole=("", 0))
    )
    out = _printed(uptime=("5000.0 1.0\n1763900000.0", 0), meminfo=(MEMINFO, 0), ours=("[]", 0)) + "\n" + answer
    got = status._one(_Host("spark-head", out), make_inventory())
    assert got.head_view[0] == os.getpid() and got.head_view[1]["state"] == "serving"
    assert [e["event"] for e in got.head_view[2]] == ["state: serving"] and got.nccl == "NCCL INFO x"
