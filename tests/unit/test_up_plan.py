"""`up`'s plan, made from facts alone (no host is touched), and what it renders; the `vllm serve`
spec it carries, whose argv no shell ever interprets (LAUNCH run locally)."""

from __future__ import annotations

import dataclasses
import io
import json
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import docker.errors
import pytest
from conftest import inventory_dict, make_inventory

from sparkcluster import redact
from sparkcluster.config import profile as profiles
from sparkcluster.config.images import RAY_VERSION, image_ref
from sparkcluster.container.spec import files_tar, spec_for
from sparkcluster.deployment import endpoint, server
from sparkcluster.errors import InputError
from sparkcluster.facts import HostFacts, parsers
from sparkcluster.labels import CONFIG_LABEL, PROFILE_LABEL
from sparkcluster.node import contract
from sparkcluster.up.plan import Plan, make_plan
from sparkcluster.up.stages import STAGES
from tests.testbed import PROFILES as TESTBED_PROFILES

REPO = Path(__file__).resolve().parents[2]
HEAD, WORKER = "spark-head", "spark-worker"
IMAGE_ID = "sha256:" + "ab" * 32
OTHER_ID = "sha256:" + "cd" * 32


@pytest.fixture(scope="module")
def prof() -> profiles.Profile:
    return profiles.load_profile("testbed")


def facts(
    head_image: str | None = None,
    worker_image: str | None = None,
    head_ours: list[dict] | None = None,
    worker_ours: list[dict] | None = None,
) -> dict[str, HostFacts]:
    return {
        HEAD: HostFacts(
            HEAD, hostname=HEAD, image_id=head_image, ours=parsers.docker_inspect_json(json.dumps(head_ours or []))
        ),
        WORKER: HostFacts(
            WORKER,
            hostname=WORKER,
            image_id=worker_image,
            ours=parsers.docker_inspect_json(json.dumps(worker_ours or [])),
        ),
    }


def inspect(
    spec, image_id: str, running: bool = True, config_hash: str | None = None, profile_name: str | None = None
) -> dict:
    """What `docker inspect` says about a container made from `spec`."""
    labels = {**spec.labels, CONFIG_LABEL: config_hash or spec.config_hash()}
    if profile_name:
        labels[PROFILE_LABEL] = profile_name
    return {
        "Id": spec.name + "-id",
        "Name": "/" + spec.name,
        "Image": image_id,
        "State": {"Status": "running" if running else "exited", "Running": running},
        "Config": {"Labels": labels, "Env": [f"{k}={v}" for k, v in spec.env.items()]},
    }


def running_facts(inv, prof, **kw) -> dict[str, HostFacts]:
    image = image_ref(inv, prof)
    ours = {n.name: [inspect(spec_for(inv, prof, n, image, IMAGE_ID), IMAGE_ID, **kw)] for n in inv.nodes}
    return facts(IMAGE_ID, IMAGE_ID, ours[HEAD], ours[WORKER])


# ---- (a) bare cluster ---------------------------------------------------------------------------


def test_bare_cluster_builds_sends_creates_and_serves(prof, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment_123")
    inv = make_inventory()
    plan = make_plan(inv, prof, facts(), serving=False, replace=False, secret_names=["HF_TOKEN", "VLLM_API_KEY"])
    assert not plan.unchanged
    assert plan.image == image_ref(inv, prof) == f"sparkcluster/vllm-ray:26.05.post1-py3-ray{RAY_VERSION}"
    assert plan.build == {"BASE_IMAGE": "nvcr.io/nvidia/vllm:26.05.post1-py3", "RAY_VERSION": RAY_VERSION}
    assert plan.send_to == [WORKER]
    assert plan.remove == {}
    assert [(c.node, c.role) for c in plan.containers] == [(HEAD, "head"), (WORKER, "worker")]
    assert plan.containers[0] == spec_for(inv, prof, inv.head, plan.image)
    assert plan.head_container == plan.containers[0].name
    sv = plan.serve
    assert sv is not None
    assert sv.container == plan.containers[0].name
    assert sv.argv[:3] == ["vllm", "serve", prof.model]
    i = sv.argv.index("--tensor-parallel-size")
    assert sv.argv[i + 1] == "2"
    assert sv.argv[sv.argv.index("--distributed-executor-backend") + 1] == "ray"
    assert sv.argv[sv.argv.index("--port") + 1] == str(inv.cluster.api_port)
    assert sv.secret_names == ["HF_TOKEN", "VLLM_API_KEY"]
    assert sv.model == "testbed-tiny"
    assert sv.port == inv.cluster.api_port
    assert sv.plugin is None
    for text in (repr(plan), plan.render(), sv.describe()):
        assert "hf_from_the_environment_123" not in text
    assert "(HF_TOKEN=******, VLLM_API_KEY=****** from a 0600 file)" in sv.describe()


def test_bare_cluster_build_uses_pip_mirror(prof):
    data = inventory_dict()
    data["cluster"]["pip_index_url"] = "http://mirror.lan:3141/simple"
    plan = make_plan(make_inventory(data), prof, facts(), serving=False, replace=False)
    assert plan.build == {
        "BASE_IMAGE": "nvcr.io/nvidia/vllm:26.05.post1-py3",
        "RAY_VERSION": RAY_VERSION,
        "PIP_INDEX_URL": "http://mirror.lan:3141/simple",
        # pip ignores a plain-http index unless its host is trusted
        "PIP_TRUSTED_HOST": "mirror.lan",
    }
    assert "--build-arg PIP_INDEX_URL=http://mirror.lan:3141/simple" in plan.render()


def test_https_mirror_is_not_marked_trusted(prof):
    data = inventory_dict()
    data["cluster"]["pip_index_url"] = "https://mirror.lan/simple"
    plan = make_plan(make_inventory(data), prof, facts(), serving=False, replace=False)
    assert "PIP_TRUSTED_HOST" not in plan.build


# ---- (b) image on the head only -----------------------------------------------------------------


def test_image_on_head_only_is_sent_not_built(prof):
    plan = make_plan(make_inventory(), prof, facts(IMAGE_ID, None), serving=False, replace=False)
    assert plan.build is None
    assert plan.send_to == [WORKER]
    assert [c.node for c in plan.containers] == [HEAD, WORKER]
    assert plan.serve is not None


def test_a_worker_sent_the_heads_image_is_not_checked_for_ray_again(prof):
    # its image ID is checked equal to the head's after the transfer, and the head's Ray is known
    # (its facts) or checked: a container on the worker would say the same (issue 40 item 7)
    f = facts(IMAGE_ID, None)
    f[HEAD].image_ray = "ray, version 2.60.0"
    plan = make_plan(make_inventory(), prof, f, serving=False, replace=False)
    assert [(s.host, s.action) for s in plan.steps() if s.stage == "image"] == [(WORKER, "receive")]
    f[HEAD].image_ray = None  # the head's own is not known: checked on the head, once
    plan = make_plan(make_inventory(), prof, f, serving=False, replace=False)
    assert [(s.host, s.action) for s in plan.steps() if s.action == "ray-version"] == [(HEAD, "ray-version")]


def test_different_image_on_worker_is_replaced(prof):
    plan = make_plan(make_inventory(), prof, facts(IMAGE_ID, OTHER_ID), serving=False, replace=False)
    assert plan.build is None and plan.send_to == [WORKER]


def test_same_image_everywhere_no_build_no_send(prof):
    plan = make_plan(make_inventory(), prof, facts(IMAGE_ID, IMAGE_ID), serving=False, replace=False)
    assert plan.build is None and plan.send_to == []
    assert [c.node for c in plan.containers] == [HEAD, WORKER]


# ---- (c) nothing to do --------------------------------------------------------------------------


def test_same_image_matching_containers_and_serving_is_unchanged(prof):
    inv = make_inventory()
    plan = make_plan(inv, prof, running_facts(inv, prof), serving=True, replace=False)
    assert plan.unchanged
    assert plan.build is None and plan.send_to == [] and plan.remove == {} and plan.containers == []
    assert plan.serve is None
    assert plan.head_container == spec_for(inv, prof, inv.head, plan.image).name
    assert "nothing to do" in plan.render()
    # issue 13: nothing runs after preflight on a cluster that already serves, so nothing else is
    # listed (the ray check used to be printed here although it never ran)
    assert [s.stage for s in plan.steps()] == ["preflight", "preflight"]


def test_matching_containers_but_not_serving_only_serves(prof):
    inv = make_inventory()
    plan = make_plan(inv, prof, running_facts(inv, prof), serving=False, replace=False)
    assert not plan.unchanged
    assert plan.containers == [] and plan.remove == {} and plan.build is None and plan.send_to == []
    assert plan.serve is not None
    assert [s for s in dict.fromkeys(s.stage for s in plan.steps())] == ["preflight", "image", "weights", "serve"]


def test_stale_config_hash_recreates_both(prof):
    inv = make_inventory()
    f = running_facts(inv, prof)
    c = f[WORKER].ours[0]
    f[WORKER].ours[0] = dataclasses.replace(c, labels={**c.labels, CONFIG_LABEL: "0" * 16})
    plan = make_plan(inv, prof, f, serving=True, replace=False)
    assert not plan.unchanged
    assert [c.node for c in plan.containers] == [HEAD, WORKER]
    assert plan.remove == {HEAD: [f[HEAD].ours[0].name], WORKER: [f[WORKER].ours[0].name]}


def test_exited_container_or_other_image_recreates(prof):
    inv = make_inventory()
    plan = make_plan(inv, prof, running_facts(inv, prof, running=False), serving=True, replace=False)
    assert not plan.unchanged and len(plan.containers) == 2
    f = running_facts(inv, prof)
    f[HEAD].ours[0] = dataclasses.replace(f[HEAD].ours[0], image_id=OTHER_ID)
    plan = make_plan(inv, prof, f, serving=True, replace=False)
    assert not plan.unchanged and len(plan.containers) == 2


def test_head_left_by_a_killed_run_is_stale_state_removed_first(prof):
    """An exited head and no worker container (what a killed `up` leaves): replaced, and said so."""
    inv = make_inventory()
    f = running_facts(inv, prof, running=False)
    f[WORKER].ours = []
    plan = make_plan(inv, prof, f, serving=False, replace=False)
    head_name = f[HEAD].ours[0].name
    assert any("stale state" in n and head_name in n and "down --purge-gcs" in n for n in plan.notes), plan.notes
    assert plan.remove == {HEAD: [head_name]}
    assert [c.node for c in plan.containers] == [HEAD, WORKER]


def test_running_cluster_being_recreated_is_not_called_stale(prof):
    inv = make_inventory()
    plan = make_plan(inv, prof, running_facts(inv, prof, config_hash="old"), serving=True, replace=False)
    assert len(plan.containers) == 2
    assert not any("stale" in n for n in plan.notes), plan.notes


# ---- (d) another profile running ----------------------------------------------------------------


def test_other_profile_running_needs_replace(prof):
    inv = make_inventory()
    f = running_facts(inv, prof, profile_name="qwen3-30b")
    with pytest.raises(InputError) as e:
        make_plan(inv, prof, f, serving=True, replace=False)
    text = e.value.message + " " + (e.value.fix or "")
    assert "--replace" in text
    assert "qwen3-30b" in e.value.message


def test_other_profile_running_with_replace(prof):
    inv = make_inventory()
    f = running_facts(inv, prof, profile_name="qwen3-30b")
    plan = make_plan(inv, prof, f, serving=False, replace=True)
    assert not plan.unchanged
    assert any("replacing" in n and "qwen3-30b" in n for n in plan.notes)
    assert plan.remove == {HEAD: [f[HEAD].ours[0].name], WORKER: [f[WORKER].ours[0].name]}
    assert [c.node for c in plan.containers] == [HEAD, WORKER]
    assert all(c.labels[PROFILE_LABEL] == prof.name for c in plan.containers)
    assert plan.serve is not None
    rendered = plan.render()
    assert "note: replacing" in rendered
    assert f"remove {f[HEAD].ours[0].name}" in rendered


def test_replace_recreates_containers_whose_config_matches_another_profile(prof):
    """Two profiles that differ only in `vllm serve` flags make containers with the same config
    hash; kept, they would still be labelled with the other profile (and the next `up` without
    --replace would refuse again), so --replace recreates them."""
    inv = make_inventory()
    f = running_facts(inv, prof, profile_name="testbed-bigger-batch")  # same hash as ours
    for serving in (False, True):
        plan = make_plan(inv, prof, f, serving=serving, replace=True)
        assert not plan.unchanged
        assert set(plan.remove) == {HEAD, WORKER}
        assert [c.labels[PROFILE_LABEL] for c in plan.containers] == [prof.name, prof.name]


# ---- (e) rendering --------------------------------------------------------------------------------


def leaky_profile() -> profiles.Profile:
    text = (TESTBED_PROFILES / "testbed.toml").read_text()
    assert "[env.forward]\n" in text
    text = text.replace("[env.forward]\n", '[env.forward]\nLEAKY_VALUE = "s3cr3t-value"\n')
    return profiles.parse(text, name="testbed")


def test_render_masks_registered_secrets():
    redact.register("s3cr3t-value")
    prof = leaky_profile()
    plan = make_plan(make_inventory(), prof, facts(), serving=False, replace=False)
    assert any("s3cr3t-value" in s.detail for s in plan.steps())  # it would leak here...
    out = plan.render()
    assert "s3cr3t-value" not in out  # ...and does not
    assert "LEAKY_VALUE=******" in out


def test_render_lists_stages_in_order(prof):
    plan = make_plan(make_inventory(), prof, facts(), serving=False, replace=False)
    out = plan.render()
    headers = [line.strip("[]") for line in out.splitlines() if line.startswith("[")]
    assert list(STAGES) == ["preflight", "replace", "image", "weights", "containers", "ray", "fabric", "probe", "serve"]
    assert headers == [s for s in STAGES if s != "replace"]  # nothing to replace: no such stage
    assert out.splitlines()[0] == (f"plan for profile 'testbed' on cluster 'pair' (image {plan.image}):")
    # head container created before the worker's
    assert out.index(f"create {plan.containers[0].name}") < out.index(f"create {plan.containers[1].name}")
    assert "build the cluster image" in out and "receive the image from the head" in out
    assert "start vllm serve" in out and "wait until ready" in out


def test_render_with_plugin_and_page_cache():
    text = (TESTBED_PROFILES / "testbed.toml").read_text()
    text = text.replace("[serve]\n", '[serve]\nreasoning_parser_plugin_url = "https://example.org/p/parser.py"\n')
    text = "drop_page_cache = true\n" + text
    prof = profiles.parse(text, name="testbed")
    plan = make_plan(make_inventory(), prof, facts(), serving=False, replace=False)
    assert plan.serve.plugin == ("https://example.org/p/parser.py", "/home/spark/.cache/huggingface/parser.py")
    out = plan.render()
    assert "stage the reasoning-parser plugin" in out
    assert "drop the page cache" in out


# ---- serve: LAUNCH, describe, plugin staging -------------------------------------------------------

HOSTILE_ARGS = ["a;b", "$(touch pwned)", "`id`", 'it\'s "quoted"', "  spaced  ", "*", "", "back\\slash", "ünï"]


def spec(argv: list[str]) -> server.ServeSpec:
    return server.ServeSpec(
        container="sparkcluster-pair-head",
        argv=argv,
        secret_names=["HF_TOKEN", "VLLM_API_KEY"],
        model="m",
        port=8000,
        plugin=None,
    )


def test_describe_never_holds_a_secret_value():
    redact.register("hf_SECRETVALUE_0123456789")
    s = spec(["vllm", "serve", "m", "--api-key-file", "/x"])
    d = s.describe()
    assert d.startswith(
        "the supervisor in sparkcluster-pair-head runs (HF_TOKEN=******, VLLM_API_KEY=****** from a 0600 file): "
    )
    assert "hf_SECRETVALUE_0123456789" not in d
    assert shlex.split(d.split(": ", 1)[1]) == ["vllm", "serve", "m", "--api-key-file", "/x"]


needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")


@needs_curl
def test_stage_plugin_command_fetches_once(tmp_path):
    src = tmp_path / "parser.py"
    src.write_text("# plugin\n")
    dst = tmp_path / "cache" / "parser.py"
    dst.parent.mkdir()
    argv = server.stage_plugin_command(f"file://{src}", str(dst))
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["sh", f"file://{src}", str(dst)]
    assert subprocess.run(argv, timeout=30).returncode == 0
    assert dst.read_text() == "# plugin\n"
    assert not Path(str(dst) + ".part").exists()
    src.unlink()  # already staged: no fetch, still fine
    assert subprocess.run(argv, timeout=30).returncode == 0
    assert dst.read_text() == "# plugin\n"


@needs_curl
def test_stage_plugin_command_failure_and_hostile_url(tmp_path):
    dst = tmp_path / "parser.py"
    url = f"file://{tmp_path}/missing $(touch pwned).py"
    res = subprocess.run(server.stage_plugin_command(url, str(dst)), cwd=tmp_path, capture_output=True, timeout=30)
    assert res.returncode != 0
    assert not dst.exists()
    assert not (tmp_path / "pwned").exists()


# ---- server.start / read_record against a tiny fake Docker API ----------------------------------------


class FakeAPI:
    """A head container whose supervisor starts what the desired-state file asks for (PID 4242)."""

    def __init__(self, supervisor=True):
        self.execs: list[tuple] = []
        self.archives: dict[str, bytes] = {}
        self.modes: dict[str, int] = {}
        self.supervisor = supervisor

    def exec_create(self, container, cmd, environment=None, stdout=True, stderr=True):
        self.execs.append((container, cmd, environment))
        if cmd[:2] == ["mv", "-f"]:
            self.archives[cmd[3]] = self.archives.pop(cmd[2])
            if self.supervisor:
                desired = json.loads(self.archives[cmd[3]])
                rec = {k: desired[k] for k in ("profile", "model", "port", "salt", "secrets_digest", "generation")}
                self.archives[server.RECORD_PATH] = json.dumps(
                    {**rec, "pid": 4242, "exec_id": "", "started_at": 1.0}
                ).encode()
        return {"Id": "exec1"}

    def exec_start(self, exec_id, detach=False):
        return b""

    def exec_inspect(self, exec_id):
        return {"ExitCode": 0}

    def put_archive(self, container, path, data):
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                if m.isfile():
                    self.archives["/" + m.name] = tar.extractfile(m).read()
                    self.modes["/" + m.name] = m.mode
        return True

    def get_archive(self, container, path):
        if path not in self.archives:
            raise docker.errors.NotFound(path)
        return iter([files_tar({path.rsplit("/", 1)[-1]: self.archives[path].decode()})]), {}


def test_start_hands_the_server_to_the_supervisor_with_secrets_in_a_private_file():
    api = FakeAPI()
    s = spec(["vllm", "serve", "m"])
    secrets = {"HF_TOKEN": "hf_tok_value_1", "VLLM_API_KEY": "key_value_2", "OTHER": "nope"}
    rec = server.start(api, s, secrets, "testbed", {"max_restarts": 3})
    assert json.loads(api.archives[contract.SECRETS_PATH]) == {
        "HF_TOKEN": "hf_tok_value_1",
        "VLLM_API_KEY": "key_value_2",
    }
    assert api.modes[contract.SECRETS_PATH] == 0o600
    desired = json.loads(api.archives[contract.DESIRED_PATH])
    assert desired["argv"] == s.argv and desired["policy"] == {"max_restarts": 3} and desired["model"] == "m"
    # desired.json keeps its names and order, and reads back through the agent's record unchanged
    assert list(desired) == [
        "generation",
        "argv",
        "model",
        "port",
        "host",
        "profile",
        "salt",
        "secrets_digest",
        "policy",
    ]
    assert contract.Desired.of(desired).doc() == desired
    assert contract.Desired.of({**desired, "later": 1}) == contract.Desired.of(desired)  # a name it does not know
    assert contract.Desired.of(None) is None and contract.Desired.of({}).argv == ()
    # no secret in the desired state, the record, or any command
    for text in (
        api.archives[contract.DESIRED_PATH].decode(),
        api.archives[server.RECORD_PATH].decode(),
        repr(api.execs),
    ):
        assert not any(v in text for v in secrets.values())
    assert (rec.pid, rec.profile, rec.model, rec.port, rec.container) == (4242, "testbed", "m", 8000, s.container)
    assert rec.generation == desired["generation"] and rec.started_with({k: secrets[k] for k in s.secret_names})
    assert server.read_record(api, s.container) == rec
    assert server.running(api, rec)
    assert api.execs[-1][1] == ["sh", "-c", 'kill -0 "$1"', "sh", "4242"]


def test_start_fails_with_the_journal_when_the_supervisor_does_not_start_it():
    api = FakeAPI(supervisor=False)
    with pytest.raises(server.NotReady, match="did not start vllm serve within 0.5s"):
        server.start(api, spec(["vllm", "serve", "m"]), {}, "testbed", {}, timeout=0.5)


def test_read_record_absent_is_none():
    assert server.read_record(FakeAPI(), "c") is None


def test_headers_from_api_key():
    assert endpoint.headers({"VLLM_API_KEY": "k"}) == {"Authorization": "Bearer k"}
    assert endpoint.headers({"HF_TOKEN": "t"}) == {}


def test_plan_is_a_plan(prof):
    assert isinstance(make_plan(make_inventory(), prof, facts(), serving=False, replace=False), Plan)


def test_replace_takes_other_deployments_down_as_steps_of_the_plan(prof):
    """Issue 23: `--replace`'s teardown of a deployment spanning another node is part of the plan,
    shown by --dry-run and walked by the executor, before anything of this deployment moves."""
    from sparkcluster.deployment.deployments import Deployment
    from sparkcluster.up.stages.replace import Away

    inv = make_inventory()
    other = Deployment("single", ("spark-worker",), {"spark-worker": ["sparkcluster-pair-head"]})
    plan = make_plan(inv, prof, facts(), serving=False, replace=True, away=[Away(other, inv.only(["spark-worker"]))])
    ids = [s.id for s in plan.steps()]
    assert "replace/spark-worker/down-single" in ids
    assert ids.index("replace/spark-worker/down-single") < min(i for i, x in enumerate(ids) if x.startswith("image/"))
    out = plan.render()
    assert "[replace]" in out and "take down 'single' on spark-worker first" in out
    assert "spark-worker: sparkcluster-pair-head" in out


# ---- on demand (issue 36): up leaves the server on standby ------------------------------------------


def _on_demand(prof):
    return prof.model_copy(update={"on_demand": prof.on_demand.model_copy(update={"enabled": True, "idle_ttl_s": 60})})


def test_an_on_demand_profile_is_handed_over_on_standby_with_no_wait_for_an_engine(prof):
    od = _on_demand(prof)
    plan = make_plan(make_inventory(), od, facts(), serving=False, replace=False)
    serve = [s.action for s in plan.steps() if s.stage == "serve"]
    assert "standby" in serve and not {"start", "ready", "warm-up", "nccl"} & set(serve)
    # image, weights, containers (and Ray) as for any profile: only the engine waits for a request
    assert {"image", "weights", "containers", "ray"} <= {s.stage for s in plan.steps()}
    text = plan.render()
    assert "hand vllm serve to the supervisor on standby" in text and "stopped after 60s idle" in text
    from sparkcluster.config import bounds

    pol = bounds.profile_policy(od)
    assert pol["on_demand"] is True and pol["idle_ttl_s"] == 60.0
    assert "on_demand" not in bounds.profile_policy(prof)  # a profile not on demand: its bounds as before


class StandbyAPI(FakeAPI):
    """A head container whose supervisor takes what it is handed on standby."""

    def __init__(self):
        super().__init__(supervisor=False)

    def exec_create(self, container, cmd, environment=None, stdout=True, stderr=True):
        got = super().exec_create(container, cmd, environment, stdout, stderr)
        if cmd[:2] == ["mv", "-f"] and cmd[3] == contract.DESIRED_PATH:
            gen = json.loads(self.archives[contract.DESIRED_PATH])["generation"]
            self.archives[contract.STATE_PATH] = json.dumps({"state": "standby", "generation": gen}).encode()
        return got


def test_standby_writes_a_private_wake_token_once_and_waits_for_the_supervisor():
    api = StandbyAPI()
    s = spec(["vllm", "serve", "m"])
    got = server.standby(api, s, {"VLLM_API_KEY": "key_value_2"}, "testbed", {"on_demand": True})
    token = api.archives[contract.WAKE_PATH].decode()
    assert len(token) >= 32 and api.modes[contract.WAKE_PATH] == 0o600
    assert got.generation == json.loads(api.archives[contract.DESIRED_PATH])["generation"]
    assert server.RECORD_PATH not in api.archives  # nothing started
    # never on a command line, nor in the desired state or the engine's secrets file
    for text in (
        repr(api.execs),
        api.archives[contract.DESIRED_PATH].decode(),
        api.archives[contract.SECRETS_PATH].decode(),
    ):
        assert token not in text
    # up again keeps it: a gateway configured before still wakes the deployment
    server.standby(api, s, {"VLLM_API_KEY": "key_value_2"}, "testbed", {"on_demand": True})
    assert api.archives[contract.WAKE_PATH].decode() == token == server.read_wake_token(api, s.container)


def test_standby_fails_with_the_journal_when_the_supervisor_does_not_take_it():
    with pytest.raises(server.NotReady, match="did not take the server on standby within 0.5s"):
        server.standby(FakeAPI(supervisor=False), spec(["vllm", "serve", "m"]), {}, "testbed", {}, timeout=0.5)


def test_down_removes_the_wake_token_with_the_desired_state():
    api = FakeAPI()
    server.disable(api, "c")
    assert contract.WAKE_PATH in api.execs[-1][1] and contract.DESIRED_PATH in api.execs[-1][1]
