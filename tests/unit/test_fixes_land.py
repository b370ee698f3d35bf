"""Every printed fix runs as printed and moves forward, loopback only: the CLI through its entry point
(`main`, as the owner's `sparkcluster` calls it) on a pair whose SSH ports are closed, so that a fix
which gets past the command line and the profile meets the nodes (exit 4) instead of the same error
again (exit 2). Each case is one an owner met: a `--node` suggestion the profile cannot run on, lint's
fix that answered "ok", an `init` fix without --head, `-i` naming a folder or a profile, an
`upgrade --image` judged last."""

from __future__ import annotations

import json
import os
import shlex

import pytest

from sparkcluster.cli.main import main
from tests.testbed import PROFILES
from tests.unit.test_first_hour import pair_toml
from tests.unit.test_newcomer import closed_port, one_toml

FAR = "connect_timeout = 1\nconnect_attempts = 1"


@pytest.fixture
def sc(tmp_path, monkeypatch, capsys):
    """An owner's laptop (an empty HOME and state dir, the testbed's profiles), and the command line."""
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "known_hosts").write_text("")
    for k in list(os.environ):
        if k.startswith(("SPARKCLUSTER_", "HF_", "VLLM_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(PROFILES))
    monkeypatch.chdir(tmp_path)

    def run(*argv: str) -> tuple[int, str, str]:
        rc = main(list(argv))
        got = capsys.readouterr()
        return rc, got.out, got.err

    run.dir = tmp_path
    return run


def pair(sc):
    p = sc.dir / "pair.toml"
    p.write_text(pair_toml(closed_port(), FAR))
    return p


def fix_of(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("fix: ")]
    assert len(lines) == 1, err
    return lines[0].removeprefix("fix: ")


def run_as_printed(sc, line: str):
    argv = shlex.split(line)
    assert argv[0] == "sparkcluster", line
    return sc(*argv[1:])


def test_a_mistyped_node_is_offered_the_nodes_the_profile_runs_on(sc):
    """TP=2 on a pair of one-GPU nodes: `--node spark-c` was offered `--node spark-b`, which lint then
    refused (2 GPUs on one); the fix is now the pair, the whole inventory: no --node at all."""
    inv = pair(sc)
    rc, out, err = sc("-i", str(inv), "up", "--profile", "testbed", "--node", "spark-c", "--dry-run")
    assert rc == 2 and "no node named 'spark-c'" in err and "did you mean" not in err, err
    assert "profile 'testbed' spans 2 GPU(s): spark-a + spark-b" in err, err
    fix = fix_of(err)
    assert fix == f"sparkcluster -i {inv} up --profile testbed --dry-run", fix
    rc, out, err = run_as_printed(sc, fix)
    assert rc == 4 and "could not be reached" in err, (rc, err)  # past the profile, at the nodes
    # a known node the profile cannot run on alone: said before lint, with the same way forward
    rc, out, err = sc("-i", str(inv), "up", "--profile", "testbed", "--node", "spark-b", "--dry-run")
    assert rc == 2 and "spans 2 GPU(s) (tensor parallel 2 x pipeline parallel 1); spark-b has 1" in err, err
    assert fix_of(err) == f"sparkcluster -i {inv} up --profile testbed --dry-run" and "lint" not in err, err
    # --json carries the same fix
    rc, out, err = sc("-i", str(inv), "up", "--profile", "testbed", "--node=spark-b", "--dry-run", "--json")
    fix = json.loads(out)["fix"]
    assert rc == 2 and fix == f"sparkcluster -i {inv} up --profile testbed --dry-run --json", out


def test_a_one_node_profile_is_offered_a_node_that_runs_as_printed(sc):
    inv = pair(sc)
    # no --node: the fix was `--node spark-a|spark-b`, a pipe to a command `spark-b` in any shell
    rc, out, err = sc("-i", str(inv), "up", "--profile", "testbed-single", "--dry-run")
    assert rc == 2 and "name it with --node (spark-a or spark-b)" in err, err
    fix = fix_of(err)
    assert fix == f"sparkcluster -i {inv} up --profile testbed-single --dry-run --node spark-a" and "|" not in fix
    rc, out, err = run_as_printed(sc, fix)
    assert rc == 4, (rc, err)
    # a mistyped node for a one-node profile: the close name, as before
    rc, out, err = sc("-i", str(inv), "up", "--profile", "testbed-single", "--node", "spark-c")
    assert rc == 2 and "did you mean 'spark-b'?" in err, err
    assert fix_of(err) == f"sparkcluster -i {inv} up --profile testbed-single --node spark-b", err


def test_lints_fix_names_what_to_change_and_checks_as_up_did(sc):
    """One Spark, a TP=2 profile: `up` said "fix the profile, then check with: sparkcluster profile
    lint testbed", which (without the inventory) skipped the cluster rules and answered "ok"."""
    one = sc.dir / "one.toml"
    one.write_text(one_toml(f"spark@127.0.0.1:{closed_port()}", FAR))
    rc, out, err = sc("-i", str(one), "up", "--profile", "testbed", "--dry-run")
    assert rc == 2 and "fails lint" in err and "[tp-pp-gpus]" in err, err
    fix = fix_of(err)
    change, _, check = fix.partition("; then check with: ")
    assert change == (
        f"set serve.tensor_parallel_size x serve.pipeline_parallel_size = 1 in {PROFILES.resolve() / 'testbed.toml'}"
    ), fix
    assert check == f"sparkcluster -i {one.resolve()} profile lint testbed", fix
    rc, out, err = run_as_printed(sc, check)
    assert rc == 1 and "[tp-pp-gpus]" in out and "ok" not in out.split(), (rc, out, err)  # the same finding
    # `profile lint --node` judges what `up --node` runs
    inv = pair(sc)
    rc, out, err = sc("-i", str(inv), "profile", "lint", "testbed-single", "--node", "spark-a")
    assert rc == 0 and "testbed-single: ok" in out, (out, err)
    rc, out, err = sc("-i", str(inv), "profile", "lint", "testbed", "--node", "spark-b")
    assert rc == 2 and "spark-b has 1" in err and fix_of(err) == f"sparkcluster -i {inv} profile lint testbed", err


def test_inits_fix_names_head_and_runs_once_the_host_is_put_in(sc):
    missing = sc.dir / "cluster.toml"
    rc, out, err = sc("-i", str(missing), "status")
    assert rc == 2 and f"no inventory at {missing}" in err, err
    fix = fix_of(err)
    line = fix.partition("write one: ")[2].partition(" (add --worker")[0]
    assert line == f"sparkcluster init --head USER@HOST -o {missing}", fix
    port = closed_port()
    rc, out, err = run_as_printed(sc, line.replace("USER@HOST", f"spark@127.0.0.1:{port}"))
    assert rc == 4 and f"nothing listens on 127.0.0.1:{port}" in err, err  # init ran: it met the host
    rc, out, err = sc("status")  # the default path: no -o, init writes there itself
    assert rc == 2 and fix_of(err).endswith(
        "write one: sparkcluster init --head USER@HOST (add --worker USER@HOST for each other Spark)"
    ), err


def test_a_folder_given_as_the_inventory_says_it_is_a_folder(sc):
    folder = sc.dir / "sparks"
    folder.mkdir()
    (folder / "notes.toml").write_text('title = "not an inventory"\n')
    rc, out, err = sc("-i", f"{folder}/", "status")
    assert rc == 2 and f"{folder} is a folder, not an inventory file" in err and "no inventory" not in err, err
    assert f"init --head USER@HOST -o {folder / 'cluster.toml'}" in fix_of(err), err
    (folder / "pair.toml").write_text(pair_toml(closed_port(), FAR))
    rc, out, err = sc("-i", f"{folder}/", "status")
    assert rc == 2 and "(the one inventory in it: pair.toml)" in err, err
    fix = fix_of(err)
    assert fix == f"sparkcluster -i {folder / 'pair.toml'} status", fix
    rc, out, err = run_as_printed(sc, fix)
    assert rc == 4, (rc, out, err)


def test_a_profile_given_as_the_inventory_says_it_is_a_profile(sc):
    prof = PROFILES / "testbed.toml"
    rc, out, err = sc("-i", str(prof), "status")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 2, err  # one line and its fix, not a line per key
    assert lines[0].startswith(f"error: {prof} is a profile (it has ") and "not an inventory" in lines[0], err
    assert f"give it as --profile {prof}" in lines[1] and "sparkcluster init --head USER@HOST" in lines[1], err


def test_upgrade_judges_the_image_reference_before_anything_else(sc):
    """No inventory at all, no good serve recorded: the reference is what is said, in one line, with
    the reference likely meant in the command line as typed; exit 2 as every usage error."""
    bad = "NVCR.io/Bad Image::tag"
    rc, out, err = sc("upgrade", "--profile", "testbed", "--image", bad)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 2 and lines[0].startswith(f"error: --image {bad!r} is not an image reference")
    assert "it has a space" in lines[0] and "'::'" in lines[0] and "not lower case" in lines[0], err
    assert lines[1] == "fix: sparkcluster upgrade --profile testbed --image nvcr.io/bad-image:tag", err
    inv = pair(sc)  # an inventory, and no good serve to return to: still the reference first
    rc, out, err = sc("-i", str(inv), "upgrade", "--image", bad, "--dry-run", "--json")
    body = json.loads(out)
    assert rc == 2 and body["exit_code"] == 2 and "not an image reference" in body["error"], out
    assert "no good serve" not in err
    rc, out, err = sc("upgrade", "--image", "nvcr.io/nvidia/vllm")
    assert rc == 2 and "it names no tag" in err and "e.g. --image nvcr.io/nvidia/vllm:" in err, err


def test_two_nodes_no_cable_joins_are_offered_two_it_does(sc):
    """A ring of four, a TP=2 profile on two nodes across it: refused (no cable joins them), and the
    fix names the first cabled pair among them rather than telling where to look."""
    nodes = "".join(
        f'\n[[nodes]]\nname = "s{i}"\nrole = "{"head" if i == 1 else "worker"}"\nssh = "spark@127.0.0.1:{closed_port()}"'
        f'\ncontrol_if = "e"\ncontrol_ip = "10.0.0.{i}"\ndata_plane = [{{ netdev = "e", hca = "h" }}]\n'
        for i in range(1, 5)
    )
    ring = sc.dir / "ring.toml"
    ring.write_text(f'[cluster]\nname = "ring"\ntopology = "ring"\n{FAR}\n{nodes}')
    rc, out, err = sc("-i", str(ring), "up", "--profile", "testbed", "--node", "s1", "--node", "s3", "--dry-run")
    assert rc == 2 and "not next to each other in the ring" in err, err
    fix = fix_of(err)
    assert fix == f"sparkcluster -i {ring} up --profile testbed --node s1 --node s2 --dry-run", fix
    rc, out, err = run_as_printed(sc, fix)
    assert rc == 4, (rc, err)  # past the cabling and the profile, at the nodes


def test_the_checks_draft_again_with_an_init_that_runs_as_printed(sc):
    """The cabling checks' fixes said "run `sparkcluster init` again", which fails without --head: they
    now print init on the inventory's own hosts, writing a new draft beside it (never over it)."""
    from sparkcluster.config import inventory

    port = closed_port()
    (sc.dir / "ssh_config").write_text("Host *\n  IdentityAgent none\n")
    p = sc.dir / "pair.toml"
    p.write_text(pair_toml(port, FAR + '\nssh_config = "ssh_config"'))
    line = inventory.load(p).init_again()
    cmd, _, then = line.partition(", then compare it with ")
    assert cmd == (
        f"sparkcluster init --head spark@127.0.0.1:{port} --worker spark@localhost:{port} --name pair "
        f"--ssh-config {sc.dir / 'ssh_config'} -o {sc.dir / 'pair.new.toml'}"
    ) and then == str(p), line
    rc, out, err = run_as_printed(sc, cmd)
    assert rc == 4 and "2 nodes could not be reached" in err, (rc, err)  # init ran, and met the hosts
