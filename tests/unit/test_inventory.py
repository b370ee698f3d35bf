"""The inventory: a testbed-like file parses; each bad input is one line per bad field, exit 2."""

from __future__ import annotations

import ipaddress

import pytest

from sparkcluster.cli.main import main
from sparkcluster.config import inventory
from sparkcluster.errors import EXIT_USAGE, InputError

GOOD = """\
# testbed-like: two Sparks, per-node interface names (the worker is cabled differently)
[cluster]
name = "testbed"
ssh_config = "ssh_config"
known_hosts = "known_hosts"
api_port = 8000

[[nodes]]
name = "spark-head"
role = "head"
ssh = "spark-head"
control_if = "enp1s0f1np1"
control_ip = "198.19.2.1"
mtu = 9000
gpus = 1
data_plane = [
  { netdev = "enp1s0f0np0", hca = "rocep1s0f0" },
  { netdev = "enp1s0f1np1", hca = "rocep1s0f1" },
  { netdev = "enP2p1s0f0np0", hca = "roceP2p1s0f0" },
  { netdev = "enP2p1s0f1np1", hca = "roceP2p1s0f1" },
]

[[nodes]]
name = "spark-worker"
role = "worker"
ssh = "root@198.51.100.7:2222"
control_if = "enp1s0f0np0"
control_ip = "198.19.2.2"
data_plane = [
  { netdev = "enp1s0f1np1", hca = "rocep1s0f0" },
  { netdev = "enp1s0f0np0", hca = "rocep1s0f1" },
]
"""


def bad(text: str) -> InputError:
    with pytest.raises(InputError) as e:
        inventory.parse(text, source="cluster.toml")
    err = e.value
    assert err.exit_code == EXIT_USAGE == 2
    return err


def replace(old: str, new: str, count: int = 1) -> str:
    assert old in GOOD
    return GOOD.replace(old, new, count)


def test_valid_inventory(tmp_path):
    p = tmp_path / "cluster.toml"
    p.write_text(GOOD)
    inv = inventory.load(p)
    assert inv.cluster.name == "testbed"
    assert inv.head.name == "spark-head" and [w.name for w in inv.workers] == ["spark-worker"]
    assert inv.head.control_ip == ipaddress.IPv4Address("198.19.2.1")
    assert inv.head.hcas == ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"]
    w = inv.node("spark-worker")
    assert w.netdevs == ["enp1s0f1np1", "enp1s0f0np0"] and w.mtu == 9000 and w.gpus == 1
    assert inv.gpu_count == 2
    # paths are relative to the inventory file
    assert inv.resolve(inv.cluster.ssh_config) == p.resolve().parent / "ssh_config"
    assert inv.resolve(None) is None


def test_env_var_names_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv(inventory.ENV_VAR, str(tmp_path / "x.toml"))
    assert inventory.default_path() == tmp_path / "x.toml"


def test_unknown_node_name():
    inv = inventory.parse(GOOD)
    with pytest.raises(InputError) as e:
        inv.node("spark-3")
    assert "spark-head, spark-worker" in e.value.fix


@pytest.mark.parametrize(
    "text,line",
    [
        (replace("gpus = 1", 'gpus = 1\ncolour = "red"'), "cluster.toml: nodes[0].colour: unknown key"),
        (replace("api_port = 8000", "api_port = 8000\nbogus = 1"), "cluster.toml: cluster.bogus: unknown key"),
        (
            replace('"198.19.2.2"', '"198.19.2.300"'),
            "cluster.toml: nodes[1].control_ip: Input is not a valid IPv4 address",
        ),
        (replace('"198.19.2.2"', '"fe80::1"'), "cluster.toml: nodes[1].control_ip: Input is not a valid IPv4 address"),
        (
            replace('ssh = "spark-head"', 'ssh = "root@spark head"'),
            "cluster.toml: nodes[0].ssh: expected an ssh config alias or user@host[:port], e.g. spark@192.168.1.11",
        ),
        (
            replace('ssh = "spark-head"', 'ssh = "spark-head; rm -rf /"'),
            "cluster.toml: nodes[0].ssh: expected an ssh config alias or user@host[:port], e.g. spark@192.168.1.11",
        ),
        (
            replace('role = "worker"', 'role = "head"'),
            'cluster.toml: (top level): exactly one node must have role = "head" (found 2)',
        ),
        (
            replace('role = "head"', 'role = "worker"'),
            'cluster.toml: (top level): exactly one node must have role = "head" (found 0)',
        ),
        (
            replace('name = "spark-worker"', 'name = "spark-head"'),
            "cluster.toml: nodes[1].name: 'spark-head' is already used by nodes[0]",
        ),
        (
            replace('"198.19.2.2"', '"198.19.2.1"'),
            "cluster.toml: nodes[1].control_ip: '198.19.2.1' is already used by nodes[0]",
        ),
        (
            replace('ssh = "root@198.51.100.7:2222"', 'ssh = "spark-head"'),
            "cluster.toml: nodes[1].ssh: 'spark-head' is already used by nodes[0]",
        ),
        (
            replace('role = "worker"', 'role = "boss"'),
            "cluster.toml: nodes[1].role: Input should be 'head' or 'worker'",
        ),
        (
            replace("mtu = 9000", "mtu = 100000"),
            "cluster.toml: nodes[0].mtu: Input should be less than or equal to 9216",
        ),
        (
            replace(
                'hca = "rocep1s0f0" },\n  { netdev = "enp1s0f0np0"',
                'hca = "rocep1s0f0 x" },\n  { netdev = "enp1s0f0np0"',
            ),
            "cluster.toml: nodes[1].data_plane[0].hca: expected an HCA name of letters, digits, '.', '_' or '-', at most 64 characters",
        ),
    ],
)
def test_one_line_per_bad_field(text, line):
    err = bad(text)
    assert err.details == [line]
    assert err.message == "cluster.toml: 1 problem(s) in the inventory"
    assert err.fix == "correct the fields listed above"


def test_several_bad_fields_several_lines():
    text = replace("gpus = 1", 'gpus = 1\ncolour = "red"')
    text = text.replace('"198.19.2.2"', '"198.19.2.300"').replace('ssh = "spark-head"', 'ssh = "a b"')
    err = bad(text)
    assert sorted(err.details) == sorted(
        [
            "cluster.toml: nodes[0].colour: unknown key",
            "cluster.toml: nodes[0].ssh: expected an ssh config alias or user@host[:port], e.g. spark@192.168.1.11",
            "cluster.toml: nodes[1].control_ip: Input is not a valid IPv4 address",
        ]
    )
    assert err.message == "cluster.toml: 3 problem(s) in the inventory"


def test_duplicate_name_and_ip_both_reported():
    text = replace('name = "spark-worker"', 'name = "spark-head"').replace('"198.19.2.2"', '"198.19.2.1"')
    assert len(bad(text).details) == 2


def test_missing_field():
    err = bad(replace('control_if = "enp1s0f1np1"\n', ""))
    assert err.details == ["cluster.toml: nodes[0].control_if: Field required"]


def test_one_node_is_an_inventory_too_and_none_is_not():
    one = GOOD[: GOOD.index('[[nodes]]\nname = "spark-worker"')]
    inv = inventory.parse(one, "cluster.toml")
    assert [n.name for n in inv.nodes] == ["spark-head"] and inv.head.name == "spark-head" and not inv.workers
    none = GOOD[: GOOD.index("[[nodes]]")]
    assert bad(none).details == ["cluster.toml: nodes: Field required"]


def test_only_keeps_the_named_nodes_and_makes_one_the_head():
    inv = inventory.parse(GOOD, "cluster.toml")
    worker = inv.only(["spark-worker"])
    assert [(n.name, n.role) for n in worker.nodes] == [("spark-worker", "head")]
    assert [(n.name, n.role) for n in inv.nodes] == [("spark-head", "head"), ("spark-worker", "worker")]
    assert [n.name for n in inv.only(["spark-worker", "spark-head"]).nodes] == ["spark-head", "spark-worker"]
    with pytest.raises(InputError, match="no node named 'spark-c'"):
        inv.only(["spark-c"])


def test_toml_syntax_error():
    err = bad(replace("[cluster]", "[cluster"))
    assert err.message.startswith("cluster.toml: not valid TOML: ")
    assert "line 2" in err.message
    assert err.details == [] and err.fix == "fix the syntax at the position shown"


def test_missing_file(tmp_path):
    with pytest.raises(InputError) as e:
        inventory.load(tmp_path / "nope.toml")
    assert e.value.exit_code == 2
    assert e.value.message == f"no inventory at {tmp_path / 'nope.toml'}"
    assert "sparkcluster init" in e.value.fix and "--inventory" in e.value.fix


def test_secrets_not_echoed():
    # a value typed into the wrong key is not printed back (it might be a token)
    err = bad(replace("api_port = 8000", 'api_port = 8000\nhf_token = "hf_abcdefghijklmnopqrstuvwxyz012345"'))
    assert "hf_abcdef" not in " ".join(err.details)


# --- through the CLI ----------------------------------------------------------------------------


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_bad_inventory_one_line_per_problem(tmp_path, capsys):
    p = tmp_path / "bad.toml"
    p.write_text(replace("gpus = 1", 'gpus = 1\ncolour = "red"').replace('"198.19.2.2"', '"198.19.2.300"'))
    rc, out, err = run_cli(capsys, "-i", str(p), "doctor")
    assert rc == 2
    assert out == ""
    lines = err.splitlines()
    assert lines == [
        f"error: {p}: 2 problem(s) in the inventory",
        f"  {p}: nodes[0].colour: unknown key",
        f"  {p}: nodes[1].control_ip: Input is not a valid IPv4 address",
        "fix: correct the fields listed above",
    ]
    assert "Traceback" not in err


def test_cli_missing_inventory(tmp_path, capsys):
    p = tmp_path / "none.toml"
    rc, out, err = run_cli(capsys, "-i", str(p), "doctor")
    assert rc == 2
    assert err.splitlines() == [
        f"error: no inventory at {p}",
        "fix: pass --inventory PATH, set $SPARKCLUSTER_INVENTORY, or write one: "
        f"sparkcluster init --head USER@HOST -o {p} (add --worker USER@HOST for each other Spark)",
    ]


def test_cli_toml_syntax_error(tmp_path, capsys):
    p = tmp_path / "broken.toml"
    p.write_text("[cluster\nname = 'x'\n")
    rc, _, err = run_cli(capsys, "--inventory", str(p), "doctor")
    assert rc == 2
    assert len(err.splitlines()) == 2 and "not valid TOML" in err and "Traceback" not in err


ONE_SPARK = """\
[cluster]
name = "one"

[[nodes]]
name = "spark-a"
role = "head"
ssh = "spark@192.168.1.11"
control_if = "enP7s7"
control_ip = "192.168.1.11"
"""


def test_one_spark_needs_no_data_plane():
    """Nothing crosses a cable on one node: its inventory names no QSFP port."""
    inv = inventory.parse(ONE_SPARK)
    assert inv.head.name == "spark-a" and inv.head.data_plane == [] and inv.head.hcas == []


def test_a_pair_without_a_data_plane_says_which_node_lacks_it():
    text = ONE_SPARK + (
        '\n[[nodes]]\nname = "spark-b"\nrole = "worker"\nssh = "spark@192.168.1.12"\n'
        'control_if = "enP7s7"\ncontrol_ip = "192.168.1.12"\n'
        'data_plane = [ { netdev = "enp1s0f1np1", hca = "rocep1s0f1" } ]\n'
    )
    with pytest.raises(InputError) as ei:
        inventory.parse(text, source="cluster.toml")
    assert ei.value.message == "cluster.toml: 1 problem(s) in the inventory"
    assert ei.value.details == [
        "cluster.toml: nodes[0].data_plane: required when the inventory has more than one node (the QSFP ports "
        "that join spark-a to the others, each with its RoCE HCA); `sparkcluster init` writes it"
    ]
