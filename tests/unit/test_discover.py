"""`sparkcluster init`: discovery as pure functions over parsed output, the TOML writer, the command."""

from __future__ import annotations

import ipaddress
import tomllib

import pytest
from conftest import LINKS, cap, hca_text, link_ip, spark_ip_json

from sparkcluster.cli.main import main
from sparkcluster.config import inventory
from sparkcluster.errors import InputError, SparkError
from sparkcluster.facts import discover, parsers, probes

# the worker cabled into the other ports: same subnets, other netdev/HCA names (sparkrun#135)
CROSSED = [
    ("enP2p1s0f0np0", "roceP2p1s0f0", 1),
    ("enP2p1s0f1np1", "roceP2p1s0f1", 2),
    ("enp1s0f0np0", "rocep1s0f0", 3),
    ("enp1s0f1np1", "rocep1s0f1", 4),
]


def output(hostname: str, host: int, links=None, hcas: str | None = None, gpu: tuple[int, str] = (0, None)) -> str:
    rc, text = gpu
    return "".join(
        f"{probes.SECTION} {n}\n{o}\n{probes.SECTION} {n} rc={r}\n"
        for n, r, o in [
            ("hostname", 0, hostname),
            ("gpu", rc, text if text is not None else cap("gb10-nvidia-smi.csv").strip()),
            ("ip", 0, spark_ip_json(host, links)),
            ("hca", 0, hca_text(links) if hcas is None else hcas),
        ]
    )


def found(worker_links=None, **kw) -> list[discover.Discovered]:
    return [
        discover.parse_discovery("spark-head", output("spark-head", 1)),
        discover.parse_discovery("root@192.168.1.12", output("spark-worker", 2, worker_links, **kw)),
    ]


# --- the script and its parsing -----------------------------------------------------------------


def test_discovery_script_is_read_only_and_sectioned():
    s = discover.discovery_script()
    assert [ln.split("'")[1].split()[1] for ln in s.splitlines()] == [
        "hostname",
        "gpu",
        "ip",
        "hca",
        "gids",
        "account",
        "meminfo",
    ]
    for word in ("mkdir", "rm ", "docker", ">"):
        assert word not in s.replace("2>/dev/null", "").replace("2>&1", "")


def test_parse_discovery_from_testbed_probe():
    # the real probe output carries the same four sections in the same format
    d = discover.parse_discovery("spark-head", cap("testbed-head-probe.txt"))
    assert d.hostname == "spark-head"
    assert [g.name for g in d.gpus] == ["NVIDIA GB10"]
    links, notes = discover.data_links(d)
    assert [(x.hca, x.netdev) for x in links] == [(hca, nd) for nd, hca, _ in LINKS]
    assert notes == []
    assert [str(a.ip) for a in links[1].addresses] == ["198.19.2.1"]


def test_parse_discovery_without_nvidia_smi():
    d = discover.parse_discovery("h", output("h", 1, gpu=(127, "bash: nvidia-smi: command not found")))
    assert d.gpus == [] and "command not found" in d.gpu_error


# --- pure choices -------------------------------------------------------------------------------


def test_data_links_in_hca_order_not_ascii_order():
    d = found()[0]
    # sysfs lists roceP2... before rocep1... (ASCII); the draft keeps port order
    d.hcas = dict(sorted(d.hcas.items()))
    assert list(d.hcas)[0] == "roceP2p1s0f0"
    links, _ = discover.data_links(d)
    assert [x.hca for x in links] == ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"]


def test_data_links_leave_out_down_and_netdevless_hcas():
    hcas = (
        "rocep1s0f0|4: ACTIVE|enp1s0f0np0 \nrocep1s0f1|1: DOWN|enp1s0f1np1 \n"
        "roceP2p1s0f0|4: ACTIVE|\nroceP2p1s0f1|4: ACTIVE|enP2p1s0f1np1 \n"
    )
    d = discover.parse_discovery("h", output("h", 1, hcas=hcas))
    links, notes = discover.data_links(d)
    assert [x.netdev for x in links] == ["enp1s0f0np0", "enP2p1s0f1np1"]
    assert len(notes) == 2
    assert any(n.startswith("rocep1s0f1 on enp1s0f1np1: port is '1: DOWN', not ACTIVE") for n in notes)
    assert any(n.startswith("roceP2p1s0f0: no netdev") for n in notes)


def test_data_links_drop_link_local_and_bridge_addresses():
    d = found()[0]
    iface = d.interfaces["enp1s0f0np0"]
    iface.addresses = [parsers.Address(ipaddress.IPv4Address("169.254.3.1"), ipaddress.IPv4Network("169.254.0.0/16"))]
    links, _ = discover.data_links(d)
    assert links[0].netdev == "enp1s0f0np0" and links[0].addresses == ()


def test_control_is_first_shared_subnet_in_hca_order():
    h, w = found()
    hc, wc = discover.choose_control([discover.data_links(h)[0], discover.data_links(w)[0]], [h, w])
    assert (hc.netdev, str(hc.ip), hc.mtu) == ("enp1s0f0np0", link_ip(1, 1), 9000)
    assert (wc.netdev, str(wc.ip)) == ("enp1s0f0np0", link_ip(1, 2))


def test_control_skips_a_head_link_the_worker_does_not_share():
    h, w = found()
    w.interfaces["enp1s0f0np0"].addresses = []  # link 1 unaddressed on the worker
    hc, wc = discover.choose_control([discover.data_links(h)[0], discover.data_links(w)[0]], [h, w])
    assert (hc.netdev, str(hc.ip), wc.netdev, str(wc.ip)) == (
        "enp1s0f1np1",
        link_ip(2, 1),
        "enp1s0f1np1",
        link_ip(2, 2),
    )


def test_control_worker_cabled_differently():
    h, w = found(CROSSED)
    hc, wc = discover.choose_control([discover.data_links(h)[0], discover.data_links(w)[0]], [h, w])
    # head link 1 (enp1s0f0np0, 198.19.1.0/24) meets the worker's enP2p1s0f0np0
    assert (hc.netdev, wc.netdev, str(wc.ip)) == ("enp1s0f0np0", "enP2p1s0f0np0", link_ip(1, 2))


def test_control_none_shared():
    h, w = found()
    for i in w.interfaces.values():
        i.addresses = []
    with pytest.raises(SparkError) as e:
        discover.choose_control([discover.data_links(h)[0], discover.data_links(w)[0]], [h, w])
    assert "static IPv4" in e.value.fix


def test_node_names():
    def d(name):
        return discover.Discovered("t", hostname=name)

    assert discover.node_names([d("spark-1a2b"), d("spark-3c4d")]) == ["spark-1a2b", "spark-3c4d"]
    assert discover.node_names([d("spark"), d("spark")]) == ["spark", "spark-worker"]
    assert discover.node_names([d(""), d("bad name!"), d("x")]) == ["spark-head", "spark-worker-1", "x"]


def test_provisional_node():
    assert discover.provisional_node("spark-head", "head", 0).name == "spark-head"
    assert discover.provisional_node("root@10.0.0.2:2222", "worker", 1).name == "10.0.0.2"
    assert discover.provisional_node("root@[fe80::1]:22", "worker", 1).name == "worker-1"
    with pytest.raises(InputError) as e:
        discover.provisional_node("root@bad host", "worker", 1)
    assert "--worker 'root@bad host'" in e.value.message


# --- draft and TOML -----------------------------------------------------------------------------


def test_draft_round_trips_through_inventory_parse(tmp_path):
    dr = discover.draft("pair", found(CROSSED), tmp_path / 'my ssh "config"', tmp_path / "kh")
    text, inv = discover.render(dr, source="draft.toml", when="2026-11-22 03:30 UTC")
    assert text.startswith("# sparkcluster inventory -- draft: review before use.")
    assert inventory.parse(text) == inv
    assert inv.cluster.ssh_config == tmp_path / 'my ssh "config"' and inv.cluster.known_hosts == tmp_path / "kh"
    head, worker = inv.nodes
    assert (head.name, head.role, head.ssh) == ("spark-head", "head", "spark-head")
    assert (worker.name, worker.role, worker.ssh) == ("spark-worker", "worker", "root@192.168.1.12")
    assert head.hcas == ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"]
    assert head.netdevs == [nd for nd, _, _ in LINKS]
    # HCA order on the worker, each HCA paired with the netdev it sits on there
    assert [(x.hca, x.netdev) for x in worker.data_plane] == [
        ("rocep1s0f0", "enp1s0f0np0"),
        ("rocep1s0f1", "enp1s0f1np1"),
        ("roceP2p1s0f0", "enP2p1s0f0np0"),
        ("roceP2p1s0f1", "enP2p1s0f1np1"),
    ]
    assert (head.control_if, str(head.control_ip)) == ("enp1s0f0np0", "198.19.1.1")
    assert (worker.control_if, str(worker.control_ip)) == ("enP2p1s0f0np0", "198.19.1.2")
    assert head.mtu == worker.mtu == 9000 and head.gpus == worker.gpus == 1
    assert "# review: control plane on 198.19.1.0/24" in text
    assert "# GPU: 1 x NVIDIA GB10, driver 580.95.05" in text
    tomllib.loads(text)


def test_draft_without_gpu_assumes_one_and_says_so():
    dr = discover.draft("pair", found(gpu=(127, "nvidia-smi: command not found")))
    text, inv = discover.render(dr, source="d")
    assert inv.nodes[1].gpus == 1
    assert "nvidia-smi found none (nvidia-smi: command not found)" in text


def test_draft_two_gpus_and_small_mtu():
    f = found(gpu=(0, "NVIDIA GB10, 580.95.05, [N/A], 12.1\nNVIDIA GB10, 580.95.05, [N/A], 12.1"))
    f[1].interfaces["enp1s0f0np0"].mtu = 1500
    _, inv = discover.render(discover.draft("pair", f), source="d")
    assert inv.nodes[1].gpus == 2 and inv.nodes[1].mtu == 1500


def test_draft_no_hca_is_an_error():
    with pytest.raises(SparkError) as e:
        discover.draft("pair", found(hcas=""))
    assert "root@192.168.1.12: no ACTIVE RoCE HCA" in e.value.message and "mlx5_ib" in e.value.fix


# --- the command --------------------------------------------------------------------------------


@pytest.fixture
def fake_hosts(monkeypatch):
    calls = []

    def fake(targets, settings, timeout=30.0):
        calls.append((list(targets), settings))
        return [discover.parse_discovery(t, output(f"spark-{i}", i + 1)) for i, t in enumerate(targets)]

    monkeypatch.setattr(discover, "discover_hosts", fake)
    return calls


def test_init_writes_draft_and_refuses_to_overwrite(tmp_path, capsys, fake_hosts):
    out = tmp_path / "conf" / "cluster.toml"
    kh = tmp_path / "known_hosts"
    rc = main(
        [
            "init",
            "--head",
            "spark-head",
            "--worker",
            "root@spark-worker:2222",
            "--known-hosts",
            str(kh),
            "--name",
            "pair",
            "-o",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    text = out.read_text()
    inv = inventory.load(out)
    assert "draft: review before use" in text.splitlines()[0]
    assert [n.name for n in inv.nodes] == ["spark-0", "spark-1"]
    assert inv.cluster.known_hosts == kh.resolve()
    targets, settings = fake_hosts[0]
    assert targets == ["spark-head", "root@spark-worker:2222"] and settings.known_hosts == kh.resolve()
    assert f"wrote {out}" in capsys.readouterr().out

    rc = main(["init", "--head", "a", "--worker", "b", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "already exists" in err and "--force" in err
    assert out.read_text() == text and len(fake_hosts) == 1  # nothing connected

    rc = main(["init", "--head", "a", "--worker", "b", "-o", str(out), "--force"])
    assert rc == 0
    assert [n.ssh for n in inventory.load(out).nodes] == ["a", "b"]
    assert list(out.parent.iterdir()) == [out]  # no temporary file left


def test_init_defaults_to_global_inventory_path(tmp_path, capsys, fake_hosts):
    out = tmp_path / "inv.toml"
    assert main(["-i", str(out), "init", "--head", "a", "--worker", "b"]) == 0
    assert inventory.load(out).cluster.name == "sparks"


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--head", "root@bad host", "--worker", "b"], "--head 'root@bad host' is not an ssh config alias"),
        (["--head", "a", "--worker", "a"], "the same ssh target is given twice"),
        (["--head", "a", "--worker", "b", "--name", "bad name"], "--name 'bad name' is not a valid cluster name"),
        (
            ["--head", "a", "--worker", "b", "--ssh-config", "/nonexistent/ssh_config"],
            "no ssh config at /nonexistent/ssh_config",
        ),
    ],
)
def test_init_bad_input_before_connecting(tmp_path, capsys, fake_hosts, argv, msg):
    rc = main(["init", *argv, "-o", str(tmp_path / "x.toml")])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and "Traceback" not in err
    assert fake_hosts == [] and not (tmp_path / "x.toml").exists()


def test_init_with_the_head_alone_drafts_one_spark(tmp_path, capsys, fake_hosts):
    """Issue 56: one Spark is the commonest setup; `--worker` was required."""
    out = tmp_path / "x.toml"
    assert main(["init", "--head", "a", "-o", str(out)]) == 0, capsys.readouterr().err
    inv = inventory.load(out)
    assert [(n.name, n.role, n.ssh) for n in inv.nodes] == [("spark-0", "head", "a")]
    node = inv.nodes[0]
    assert node.control_if == "enP7s7" and str(node.control_ip) == "192.168.1.11"  # its LAN, not a CX-7 port
    assert [x.hca for x in node.data_plane] == ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"]
    assert "topology" not in out.read_text()


def test_one_spark_without_cables_lists_its_ports_for_a_second_spark():
    d = discover.parse_discovery("a", output("spark-a", 1, hcas=hca_text(state="1: DOWN")))
    text, inv = discover.render(discover.draft("solo", [d]), source="d")
    assert len(inv.nodes[0].data_plane) == 4 and "no ConnectX-7 port is ACTIVE" in text
    assert inv.nodes[0].control_if == "enP7s7"
    with pytest.raises(SparkError, match="no RoCE HCA"):
        discover.draft("solo", [discover.parse_discovery("a", output("spark-a", 1, hcas=""))])
