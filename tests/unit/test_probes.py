"""Node-side command builders (`sparkcluster.facts.probes`) run locally with bash against hostile names:
nothing in a name may run as a command, and every section comes back under its own name."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import cap

from sparkcluster import facts
from sparkcluster.facts import parsers, probes

HOSTILE = ["with space", "it's", 'say"hi"', "$(touch CANARY)", "a;touch CANARY", "`touch CANARY`", "x\\y", "-I"]


@pytest.fixture
def shell(tmp_path):
    """Run a script with bash in tmp_path, with stand-in `ping` and `ip` that print their argv."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("ping", "ip"):
        f = bindir / tool
        f.write_text(f"#!/bin/bash\nprintf '{tool}'; printf ' <%s>' \"$@\"; echo\n")
        f.chmod(0o755)

    def run(script: str) -> str:
        env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
        r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=20)
        assert not (tmp_path / "CANARY").exists(), "a name ran as a command"
        return r.stdout

    return run


@pytest.mark.parametrize("name", HOSTILE)
def test_ping_and_neigh_pass_hostile_names_as_one_argument(shell, name):
    script = probes.script([probes.ping(name, "198.19.2.2", 8972), probes.neigh(name, "198.19.2.2")])
    secs = probes.split_sections(shell(script))
    assert secs[f"ping {name} 198.19.2.2"].out.strip() == (
        f"ping <-M> <do> <-c> <1> <-W> <1> <-s> <8972> <-I> <{name}> <198.19.2.2>"
    )
    assert secs[f"neigh {name} 198.19.2.2"].out.strip() == f"ip <neigh> <show> <to> <198.19.2.2> <dev> <{name}>"


@pytest.mark.parametrize("name", HOSTILE)
def test_carrier_reads_sysfs_for_hostile_names_without_running_them(shell, name):
    out = probes.split_sections(shell(probes.carrier([name, "lo"]).script()))["carrier"]
    lines = out.out.splitlines()
    assert lines[0] == f"{name} - -"  # no such netdev: both values "-"
    assert lines[1].startswith("lo ")


def test_path_mtu_script_from_facts_is_quoted(shell):
    ps = [facts.PathMtuPing(n, "w", "198.19.2.2", 8972) for n in HOSTILE]
    secs = probes.split_sections(shell(facts.path_mtu_script(ps)))
    assert len(secs) == 2 * len(HOSTILE)


def test_fixed_probes_run_with_bash_on_a_machine_without_hcas(shell):
    # the GID and HCA loops must print nothing (and not fail the script) where /sys/class/infiniband is absent
    secs = probes.split_sections(shell(probes.script([probes.HCA, probes.GIDS, probes.ROUTE])))
    assert set(secs) == {"hca", "gids", "route"}
    assert parsers.gid_lines(secs["gids"].out) == {} or os.path.isdir("/sys/class/infiniband")


def test_gid_probe_reads_a_sysfs_shaped_tree(tmp_path):
    # a GID table laid out as the kernel does (gids/N, gid_attrs/types/N, gid_attrs/ndevs/N), read by
    # the probe's own loop with the root moved to tmp_path
    base = tmp_path / "sys/class/infiniband/rocep1s0f1/ports/1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (base / sub).mkdir(parents=True)
    rows = {
        0: ("fe80:0000:0000:0000:4ebb:47ff:fe21:0001", "IB/RoCE v1"),
        1: ("fe80:0000:0000:0000:4ebb:47ff:fe21:0001", "RoCE v2"),
        2: ("0000:0000:0000:0000:0000:ffff:c613:0201", "IB/RoCE v1"),
        3: ("0000:0000:0000:0000:0000:ffff:c613:0201", "RoCE v2"),
        4: ("0000:0000:0000:0000:0000:0000:0000:0000", None),
    }
    for i, (gid, kind) in rows.items():
        (base / "gids" / str(i)).write_text(gid + "\n")
        if kind:
            (base / "gid_attrs/types" / str(i)).write_text(kind + "\n")
            (base / "gid_attrs/ndevs" / str(i)).write_text("enp1s0f1np1\n")
    cmd = probes.GIDS.command.replace("/sys/class/infiniband", str(tmp_path / "sys/class/infiniband"))
    got = parsers.gid_lines(subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=10).stdout)
    gids = got["rocep1s0f1"]
    assert [g.index for g in gids] == [0, 1, 2, 3]  # the zero GID is not printed
    v2 = [g for g in gids if g.roce_v2 and g.ipv4]
    assert [(g.index, str(g.ipv4), g.ndev) for g in v2] == [(3, "198.19.2.1", "enp1s0f1np1")]


def test_section_names_with_quotes_round_trip(shell):
    text = shell(probes.section('it\'s a "name"', "echo hi"))
    assert probes.split_sections(text) == {'it\'s a "name"': probes.Section(0, "hi\n")}


def test_ping_reason_on_captured_pings():
    assert "mtu=1400" in parsers.ping_reason(cap("vm-ping-eth0-1472-toolarge.txt"))


def test_neigh_and_route_parsers():
    # the shapes `ip neigh show to IP dev IF` and `ip -j route show default` print
    assert parsers.neigh_mac("198.19.2.2 lladdr 4C:BB:47:21:00:02 REACHABLE\n") == "4c:bb:47:21:00:02"
    assert parsers.neigh_mac("198.19.2.2  FAILED\n") == ""
    assert parsers.default_route_devs(
        '[{"dst":"default","gateway":"192.168.1.1","dev":"enP7s7","protocol":"dhcp","metric":100,"flags":[]}]'
    ) == ["enP7s7"]
    assert parsers.default_route_devs("") == [] and parsers.default_route_devs("not json") == []


@pytest.mark.parametrize("name", HOSTILE)
def test_ours_and_disk_keep_hostile_values_inert(shell, tmp_path, name):
    # no docker here (or a daemon-less CLI): what matters is that nothing in the value runs
    shell(probes.script([probes.ours(f"org.sparkcluster.cluster={name}"), probes.disk(str(tmp_path / name / "hf"))]))
    secs = probes.split_sections(shell(probes.disk(str(tmp_path / name)).script()))
    assert secs["disk"].out.count("\n") >= 1


def test_listeners_ports_are_integers_only():
    assert "sport = :6379 or sport = :8000" in probes.listeners([6379, 8000]).command
    with pytest.raises(ValueError):
        probes.listeners(["6379; touch CANARY"])


@pytest.mark.parametrize("name", HOSTILE)
def test_image_layers_passes_a_hostile_ref_as_one_argument(shell, tmp_path, name):
    # a stand-in docker that keeps the ref it was given: it arrives whole, and nothing in it runs
    f = tmp_path / "bin" / "docker"
    f.write_text(
        '#!/bin/bash\n[ "$1" = image ] && { printf \'%s\' "$5" > ref.txt; echo \'sha256:x ["sha256:a"]\'; exit 0; }\n'
        '[ "$1" = history ] && { echo 7; echo 0; exit 0; }\nexit 1\n'
    )
    f.chmod(0o755)
    secs = probes.split_sections(shell(probes.image_layers("base", name).script()))
    got = probes.value(probes.image_layers("base", name), secs)
    assert got.id == "sha256:x" and got.layers == ("sha256:a",) and got.sizes == (7,)
    assert (tmp_path / "ref.txt").read_text() == name


def test_facts_are_read_through_the_probes_only():
    """Issue 54: one probe style. A section is read by `probes.value`, `output` or `failure` (and
    `reading` for an exit status that means something of its own), never by hand: no module of
    facts/ but probes.py takes a section's `.out` or `.rc`."""
    import ast
    from pathlib import Path

    by_hand = []
    for p in sorted((Path(__file__).resolve().parents[2] / "sparkcluster" / "facts").glob("*.py")):
        if p.name == "probes.py":
            continue
        for n in ast.walk(ast.parse(p.read_text())):
            if (
                isinstance(n, ast.Attribute)
                and n.attr in ("out", "rc")
                and not ast.unparse(n.value).startswith("probes.reading(")
            ):
                by_hand.append(f"{p.name}:{n.lineno}: {ast.unparse(n)}")
    assert by_hand == []
