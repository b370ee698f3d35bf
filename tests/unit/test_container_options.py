"""A profile's container options (issue 51): `security_opt` and `privileged`, as NVIDIA's current Spark
recipes pass them (`--security-opt seccomp=unconfined --security-opt apparmor=unconfined`, for vLLM's
io_uring loading, which Docker's default seccomp profile blocks since moby/moby#46762; or
`--privileged`), reach the container's create options, the dry run's `docker run` line and
`profile show`, and lint warns that they widen the container's rights."""

from __future__ import annotations

import json
import shlex

from conftest import make_inventory
from test_lint import rules, variant
from test_profile_cli import INV, run

from sparkcluster.config import profile
from sparkcluster.config.lint import lint
from sparkcluster.container.spec import spec_for

IMAGE = "sparkcluster/vllm-ray:26.05.post1-py3-ray2.60.0"
NVIDIA_OPTS = ["seccomp=unconfined", "apparmor=unconfined"]


def _with(**kw) -> profile.Profile:
    return profile.load_profile("testbed").model_copy(update=kw)


def test_security_opt_and_privileged_reach_the_create_options_and_the_dry_run():
    inv = make_inventory()
    p = _with(security_opt=NVIDIA_OPTS, privileged=True)
    for node in inv.nodes:
        s = spec_for(inv, p, node, IMAGE)
        hc = s.host_config_kwargs()
        assert hc["security_opt"] == NVIDIA_OPTS and hc["privileged"] is True
        argv = shlex.split(s.docker_run_equivalent())  # what `up --dry-run` prints (up/stages/containers.py)
        assert "--security-opt=seccomp=unconfined" in argv and "--security-opt=apparmor=unconfined" in argv
        assert "--privileged" in argv and argv.index("--privileged") < argv.index(IMAGE)
    # a change of options is a change of the container (its config hash), as any other flag
    plain = spec_for(inv, profile.load_profile("testbed"), inv.head, IMAGE)
    assert plain.config_hash() != spec_for(inv, p, inv.head, IMAGE).config_hash()


def test_without_them_nothing_changes():
    inv = make_inventory()
    s = spec_for(inv, profile.load_profile("testbed"), inv.head, IMAGE)
    hc = s.host_config_kwargs()
    assert "security_opt" not in hc and "privileged" not in hc
    assert "--security-opt" not in s.docker_run_equivalent() and "--privileged" not in s.docker_run_equivalent()


def test_lint_warns_where_they_widen_the_container_rights():
    got = lint(variant(security_opt=NVIDIA_OPTS))
    (w,) = [x for x in got if x.rule == "container-rights"]
    assert w.severity == "warn" and "seccomp=unconfined" in w.message and "moby/moby#46762" in w.fix
    (w,) = [x for x in lint(variant(privileged=True)) if x.rule == "container-rights"]
    assert w.severity == "warn" and "--privileged" in w.message
    # a narrowing option is said nothing of; a malformed one fails
    assert "container-rights" not in rules(lint(variant(security_opt=["no-new-privileges"])))
    (f,) = [x for x in lint(variant(security_opt=["seccomp unconfined"])) if x.rule == "security-opt"]
    assert f.severity == "fail"
    assert "container-rights" not in rules(lint(variant()))


def test_profile_show_says_them(capsys, tmp_path):
    src = (profile.find("testbed")).read_text()
    f = tmp_path / "testbed-io-uring.toml"
    head, rest = src.split("[image]", 1)
    f.write_text(
        head + 'security_opt = ["seccomp=unconfined", "apparmor=unconfined"]\nprivileged = true\n[image]' + rest
    )
    rc, out, _ = run(capsys, "-i", INV, "profile", "show", str(f))
    assert rc == 0, out
    assert "container options: --security-opt=seccomp=unconfined --security-opt=apparmor=unconfined --privileged" in out
    rc, out, _ = run(capsys, "-i", INV, "profile", "show", str(f), "--json")
    r = json.loads(out)
    assert r["security_opt"] == NVIDIA_OPTS and r["privileged"] is True
