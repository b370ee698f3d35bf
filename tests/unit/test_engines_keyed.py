"""An engine is never reachable on the LAN without a key (issue 70 item 2).

vLLM's `--api-key` (VLLM_API_KEY) guards only some routes: vLLM's security guide
(https://docs.vllm.ai/en/stable/usage/security/, its API key section) lists the /v1, /v2,
/inference and /cohere prefixes as protected and says other endpoints, /invocations (SageMaker's chat
route) and /pause among them, answer without it. So every engine gets a key whatever its profile's
`secrets` (the owner's, else one generated into the 0600 .env, never shown), and engines listen
only on the cluster's side by default: their head's control address, loopback on a one-node cluster.
The owner's opt-out (`engines_listen = "all"`) is warned at every `up`; the dry run never claims a
secret that is not there."""

from __future__ import annotations

import io
import os
import stat

import pytest
from conftest import inventory_dict, make_inventory
from rich.console import Console

from sparkcluster import redact
from sparkcluster.cli import main as cli_main
from sparkcluster.cli.up_cmd import with_api_key
from sparkcluster.config import profile as profiles
from sparkcluster.config import secrets as secret_store
from sparkcluster.config.flags import engine_host
from sparkcluster.deployment import endpoint
from sparkcluster.deployment.deployments import Deployment
from sparkcluster.facts import HostFacts, parsers
from sparkcluster.gateway import rollout
from sparkcluster.monitor import scrape
from sparkcluster.up import bringup
from sparkcluster.up.plan import make_plan
from tests.testbed import PROFILES as TESTBED_PROFILES

HEAD, WORKER = "spark-head", "spark-worker"
HF = "hf_keyedEnginesToken0123456789"


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    for n in ("HF_TOKEN", "VLLM_API_KEY", "SPARKCLUSTER_ENV_FILE"):
        monkeypatch.delenv(n, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # DEFAULT_ENV_FILE under a home of the test's own
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("SPARKCLUSTER_PROFILES", str(TESTBED_PROFILES))


@pytest.fixture(scope="module")
def prof():
    return profiles.load_profile("testbed")


def _inv(listen: str | None = None, nodes: int = 2):
    data = inventory_dict()
    data["nodes"] = data["nodes"][:nodes]
    if listen:
        data["cluster"]["engines_listen"] = listen
    return make_inventory(data)


def _facts(inv, image_id=None):
    return {
        n.name: HostFacts(n.name, hostname=n.name, image_id=image_id, ours=parsers.docker_inspect_json("[]"))
        for n in inv.nodes
    }


def _host_flag(argv):
    return argv[argv.index("--host") + 1]


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, highlight=False, width=300), buf


# ---- every engine gets a key ---------------------------------------------------------------------


def test_the_key_is_passed_whatever_the_profiles_secrets(prof, tmp_path):
    bare = prof.model_copy(update={"secrets": []})
    assert profiles.secret_env_names(bare) == ["VLLM_API_KEY"]
    assert profiles.secret_env_names(prof) == ["HF_TOKEN", "VLLM_API_KEY"]
    envf = tmp_path / ".env"
    envf.write_text("VLLM_API_KEY=sk-ownersKey0123456789abcd\n")
    envf.chmod(0o600)
    assert secret_store.load_secrets(envf, bare) == {"VLLM_API_KEY": "sk-ownersKey0123456789abcd"}


def test_a_generated_key_is_written_0600_to_a_new_env_file_and_masked(tmp_path):
    path = tmp_path / "conf" / "sparkcluster" / ".env"
    secrets: dict[str, str] = {}
    assert secret_store.generate_api_key(path, secrets) == path
    key = secrets["VLLM_API_KEY"]
    assert len(key) > 40 and key.startswith("sk-")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == f"VLLM_API_KEY={key}\n"
    assert redact.mask(f"Bearer {key}") == f"Bearer {redact.MASK}"
    # read back by the next command
    assert secret_store.load_secrets(path, names=["VLLM_API_KEY"]) == {"VLLM_API_KEY": key}


def test_a_generated_key_is_appended_to_the_owners_env_file(tmp_path):
    envf = tmp_path / ".env"
    envf.write_text(f"HF_TOKEN={HF}")  # no newline at its end
    envf.chmod(0o600)
    secrets = {"HF_TOKEN": HF}
    secret_store.generate_api_key(envf, secrets)
    assert envf.read_text() == f"HF_TOKEN={HF}\nVLLM_API_KEY={secrets['VLLM_API_KEY']}\n"
    assert stat.S_IMODE(envf.stat().st_mode) == 0o600


def test_the_owners_key_is_kept(tmp_path):
    secrets = {"VLLM_API_KEY": "sk-ownersKey0123456789abcd"}
    assert secret_store.generate_api_key(tmp_path / ".env", secrets) is None
    assert not (tmp_path / ".env").exists() and secrets == {"VLLM_API_KEY": "sk-ownersKey0123456789abcd"}


def test_no_key_goes_into_a_file_others_can_read(tmp_path):
    envf = tmp_path / ".env"
    envf.write_text(f"HF_TOKEN={HF}\n")
    envf.chmod(0o644)
    with pytest.raises(secret_store.InputError, match="readable by group or others"):
        secret_store.generate_api_key(envf, {})
    assert "VLLM_API_KEY" not in envf.read_text()


def test_the_default_file_is_the_one_the_readme_names(tmp_path):
    assert secret_store.key_file(None) == secret_store.DEFAULT_ENV_FILE.expanduser()
    assert str(secret_store.key_file(None)).startswith(str(tmp_path / "home"))
    assert secret_store.key_file(tmp_path / "x.env") == tmp_path / "x.env"


def test_the_command_says_where_it_wrote_the_key_never_the_key(tmp_path):
    envf = tmp_path / ".env"
    secrets: dict[str, str] = {}
    console, buf = _console()
    with_api_key(envf, secrets, False, console)
    said = buf.getvalue()
    assert str(envf) in said and "0600" in said and secrets["VLLM_API_KEY"] not in said


def test_a_dry_run_generates_nothing_and_says_what_a_real_run_would_do(tmp_path):
    envf = tmp_path / ".env"
    secrets: dict[str, str] = {}
    console, buf = _console()
    with_api_key(envf, secrets, True, console)
    assert secrets == {} and not envf.exists()
    assert f"a real run generates one and writes it to {envf}" in buf.getvalue()


def test_the_generated_key_never_reaches_argv_the_plan_or_its_json(prof, tmp_path):
    secrets: dict[str, str] = {"HF_TOKEN": HF}
    secret_store.generate_api_key(tmp_path / ".env", secrets)
    key = secrets["VLLM_API_KEY"]
    inv = _inv()
    plan = make_plan(inv, prof, _facts(inv), serving=False, replace=False, secret_names=secrets.keys())
    texts = [" ".join(plan.serve.argv), plan.render(), plan.as_json(), plan.serve.describe(), repr(plan)]
    texts += [" ".join(argv) for _, _, argv in plan.serve.ranks]
    assert not [t for t in texts if key in t]
    assert "(HF_TOKEN=******, VLLM_API_KEY=****** from a 0600 file)" in plan.serve.describe()


# ---- the secrets line of a dry run says what is there -------------------------------------------


def test_the_dry_runs_secrets_line_names_only_the_secrets_this_run_has(prof):
    inv = _inv()
    none = make_plan(inv, prof, _facts(inv), serving=False, replace=False, secret_names=[])
    assert "(no secret)" in none.serve.describe() and "******" not in none.serve.describe()
    assert none.serve.secret_names == []
    text = none.render()
    assert "from a 0600 file" not in text
    assert "warning: HF_TOKEN is not set, so it is not passed" in text
    assert "VLLM_API_KEY is not set: up generates one first" in text
    one = make_plan(inv, prof, _facts(inv), serving=False, replace=False, secret_names=["HF_TOKEN"])
    assert "(HF_TOKEN=****** from a 0600 file)" in one.serve.describe()
    assert "HF_TOKEN is not set" not in one.render()


@pytest.fixture
def cli(monkeypatch, tmp_path):
    """The real `up` command line: its offline dry run connects to nothing."""
    inv = _inv()
    monkeypatch.setattr(cli_main.Invocation, "inventory", lambda self: inv)

    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        import contextlib

        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli_main.main(list(argv))
        return rc, out.getvalue(), err.getvalue()

    return run


def test_an_offline_dry_run_without_secrets_claims_none(cli, tmp_path, capsys):
    envf = tmp_path / "empty.env"
    envf.write_text("")
    envf.chmod(0o600)
    rc = cli_main.main(["up", "--profile", "testbed", "--dry-run", "--offline", "--env-file", str(envf)])
    got = capsys.readouterr()
    assert rc == 0, got.err
    assert "VLLM_API_KEY=******" not in got.out and "HF_TOKEN=******" not in got.out
    assert "(no secret)" in got.out and "HF_TOKEN is not set" in got.out
    assert f"a real run generates one and writes it to {envf}" in got.err
    assert envf.read_text() == ""  # a dry run changes nothing


def test_an_offline_dry_run_with_the_secrets_names_both_masked(cli, tmp_path, capsys):
    envf = tmp_path / ".env"
    envf.write_text(f"HF_TOKEN={HF}\nVLLM_API_KEY=sk-ownersKey0123456789abcd\n")
    envf.chmod(0o600)
    rc = cli_main.main(["up", "--profile", "testbed", "--dry-run", "--offline", "--env-file", str(envf)])
    got = capsys.readouterr()
    assert rc == 0, got.err
    assert "(HF_TOKEN=******, VLLM_API_KEY=****** from a 0600 file)" in got.out
    assert HF not in got.out + got.err and "sk-ownersKey" not in got.out + got.err
    assert "not set" not in got.out


def test_a_real_up_generates_the_key_passes_it_and_says_where(monkeypatch, tmp_path, capsys):
    inv = _inv()
    monkeypatch.setattr(cli_main.Invocation, "inventory", lambda self: inv)
    envf = tmp_path / "home" / ".config" / "sparkcluster" / ".env"  # none yet: the one README names
    seen = {}

    def fake_run(inventory, prof, secrets, progress, **kw):
        seen.update(secrets)
        return bringup.UpSummary(False, "http://198.19.2.1:8000/v1", prof.served_model_name, 42, {"serve": 1.0})

    monkeypatch.setattr(bringup, "run", fake_run)
    rc = cli_main.main(["up", "--profile", "testbed"])
    got = capsys.readouterr()
    assert rc == 0, got.err
    key = seen["VLLM_API_KEY"]
    assert f"VLLM_API_KEY={key}\n" in envf.read_text() and stat.S_IMODE(envf.stat().st_mode) == 0o600
    assert str(envf) in got.err and key not in got.out + got.err
    # how to reach an engine that listens only on the cluster's side
    assert "clients come through the gateway (sparkcluster gateway up)" in got.out
    assert "ssh -N -L 8000:198.19.2.1:8000 spark@spark-head" in got.out
    assert "curl -s http://127.0.0.1:8000/v1/chat/completions" in got.out


# ---- where the engine listens, by node count -------------------------------------------------------


def test_on_a_pair_the_engine_listens_on_its_heads_control_address(prof):
    inv = _inv()
    assert inv.cluster.engines_listen == "control" and not inv.alone
    plan = make_plan(inv, prof, _facts(inv), serving=False, replace=False)
    ip = str(inv.head.control_ip)
    assert _host_flag(plan.serve.argv) == ip == plan.serve.host == inv.engine_address()


def test_on_one_node_the_engine_listens_on_loopback(prof):
    inv = _inv(nodes=1)
    single = profiles.load_profile("testbed-single")
    assert inv.alone and engine_host(inv, single) == "127.0.0.1" == inv.engine_address()
    plan = make_plan(inv, single, _facts(inv, "sha256:" + "a" * 64), serving=False, replace=False)
    assert _host_flag(plan.serve.argv) == "127.0.0.1" == plan.serve.host  # the supervisor asks it there


def test_a_one_node_deployment_on_a_pair_listens_on_its_nodes_control_address():
    """The gateway may run on the other node: the part of a pair is not a one-node cluster."""
    inv = _inv()
    part = inv.only([WORKER])
    single = profiles.load_profile("testbed-single")
    assert not part.alone and engine_host(part, single) == str(part.head.control_ip) == str(inv.node(WORKER).control_ip)
    assert part.at_slot(1).alone is False  # a slot keeps what the part knows of the whole


def test_the_gateway_and_prometheus_reach_a_one_node_engine_on_loopback():
    inv = _inv(nodes=1)
    single = profiles.load_profile("testbed-single")
    found = [Deployment("testbed-single", (HEAD,))]
    (up,) = rollout.upstreams(inv, found, {"testbed-single": single})
    assert up.url == f"http://127.0.0.1:{inv.cluster.api_port}"
    assert up.supervisor.startswith(f"http://{inv.head.control_ip}:")  # the agent's report: unchanged
    vllm = [t for t in scrape.targets(inv, [scrape.Served("testbed-single", (HEAD,), 8000)]) if t.job == "vllm"]
    assert [t.address for t in vllm] == ["127.0.0.1:8000"]


def test_the_gateway_and_prometheus_reach_a_pairs_engine_at_its_heads_control_address():
    inv = _inv()
    found = [Deployment("testbed-single", (WORKER,))]
    (up,) = rollout.upstreams(inv, found, {"testbed-single": profiles.load_profile("testbed-single")})
    assert up.url == f"http://{inv.node(WORKER).control_ip}:{inv.cluster.api_port}"
    vllm = [t for t in scrape.targets(inv, [scrape.Served("testbed-single", (WORKER,), 8000)]) if t.job == "vllm"]
    assert [t.address for t in vllm] == [f"{inv.node(WORKER).control_ip}:8000"]


def test_the_controller_forwards_to_loopback_on_one_node():
    inv = _inv(nodes=1)
    asked = []

    class Head:
        address = "198.51.100.7"

        def tunnel(self, ip, port):
            asked.append((ip, port))
            raise ConnectionRefusedError  # nothing listens yet: the caller's questions find out

    with endpoint.reached(Head(), inv, 8000) as base:
        assert base.startswith("http://127.0.0.1:")
    assert asked == [("127.0.0.1", 8000)]


def test_the_ssh_forward_printed_runs_as_the_owner_would_type_it(tmp_path):
    data = inventory_dict()
    data["nodes"] = data["nodes"][:1]
    data["nodes"][0]["ssh"] = "spark@192.0.2.10:2222"
    data["cluster"]["ssh_config"] = "ssh_config"
    inv = make_inventory(data)
    inv = inv.model_copy(update={"path": tmp_path / "cluster.toml"})
    cmd, base = endpoint.ssh_forward(inv, 8000)
    assert cmd == f"ssh -N -F {tmp_path / 'ssh_config'} -p 2222 -L 8000:127.0.0.1:8000 spark@192.0.2.10"
    assert base == "http://127.0.0.1:8000/v1"


# ---- the owner's opt-out, warned at every up -------------------------------------------------------


def test_all_is_warned_in_every_plan_before_anything_starts(prof):
    inv = _inv("all")
    plan = make_plan(inv, prof, _facts(inv), serving=False, replace=False)
    assert _host_flag(plan.serve.argv) == "0.0.0.0"
    assert plan.notes[0].startswith('warning: engines_listen = "all" in the inventory')
    assert "/invocations, /pause" in plan.notes[0] and "0.0.0.0 on spark-head" in plan.notes[0]
    assert "warning: engines_listen" in plan.render()
    default = make_plan(_inv(), prof, _facts(_inv()), serving=False, replace=False)
    assert not [n for n in default.notes if "engines_listen" in n]


def test_all_is_warned_even_when_nothing_changes(prof):
    """`up` prints the plan's notes before it looks whether the same profile already serves."""
    inv = _inv("all")
    plan = make_plan(inv, prof, _facts(inv), serving=True, replace=False)
    assert any(n.startswith('warning: engines_listen = "all"') for n in plan.notes)


# ---- profile show ------------------------------------------------------------------------------------


def test_profile_show_says_which_secrets_are_passed_and_warns_of_the_missing(capsys, tmp_path):
    envf = tmp_path / ".env"
    envf.write_text(f"HF_TOKEN={HF}\n")
    envf.chmod(0o600)
    rc = cli_main.main(["profile", "show", "testbed-single", "--env-file", str(envf)])
    got = capsys.readouterr()
    assert rc == 0, got.err
    assert "HF_TOKEN=****** VLLM_API_KEY=(not set)" in got.out and HF not in got.out
    assert f"note: no VLLM_API_KEY found: `up` generates one and writes it to {envf} (mode 0600)" in got.out
    os.remove(envf)


def test_profile_show_json_names_the_missing(capsys, tmp_path):
    import json

    envf = tmp_path / ".env"
    envf.write_text("")
    envf.chmod(0o600)
    rc = cli_main.main(["profile", "show", "testbed-single", "--env-file", str(envf), "--json"])
    got = capsys.readouterr()
    assert rc == 0, got.err
    doc = json.loads(got.out)
    assert doc["secrets_exec_env"] == {"HF_TOKEN": "(not set)", "VLLM_API_KEY": "(not set)"}
    assert doc["secrets_missing"] == ["HF_TOKEN", "VLLM_API_KEY"]
