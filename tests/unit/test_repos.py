"""Which hub repositories a profile needs on every node (issue 24): the model, a separate tokenizer,
a draft model from the speculative config, a plugin file; and how the plan lists each of them."""

from __future__ import annotations

import json

from conftest import make_inventory

from sparkcluster.config import profile as profiles
from sparkcluster.config import repos
from sparkcluster.facts import HostFacts
from sparkcluster.up.plan import make_plan

PLUGIN = "https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4/raw/main/super_v3_reasoning_parser.py"


def variant(name: str = "testbed", **serve) -> profiles.Profile:
    p = profiles.load_profile(name)
    return p.model_copy(update={"serve": p.serve.model_copy(update=serve)})


def test_seed_004_profiles_need_their_second_repository():
    # seed 004: --tokenizer Qwen/Qwen3.6-35B-A3B beside RedHatAI's NVFP4 weights
    got = repos.needed(profiles.load_profile("qwen36-35b-nvfp4-mtp"))
    assert [(n.roles, n.repo, n.revision, n.weights) for n in got] == [
        (("model",), "RedHatAI/Qwen3.6-35B-A3B-NVFP4", "main", True),
        (("tokenizer",), "Qwen/Qwen3.6-35B-A3B", "main", False),
    ]
    # the tokenizer repository is the full BF16 model: only its small files are staged
    tok = got[1]
    assert tok.keeps("tokenizer.json") and tok.keeps("tokenizer_config.json") and tok.keeps("config.json")
    assert not tok.keeps("model-00001-of-00014.safetensors")
    # seed 004: "model":"google/gemma-4-26B-A4B-it-assistant" in --speculative-config
    got = repos.needed(profiles.load_profile("gemma4-26b-fp8-mtp"))
    assert [(n.roles, n.repo, n.weights) for n in got] == [
        (("model",), "google/gemma-4-26B-A4B-it", True),
        (("draft model",), "google/gemma-4-26B-A4B-it-assistant", True),
    ]


def test_seed_002_plugin_is_a_file_of_the_model_repository():
    got = repos.needed(profiles.load_profile("nemotron"))
    assert [(n.roles, n.repo, n.files) for n in got] == [
        (("model", "reasoning-parser plugin"), "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4", None)
    ]
    assert repos.plugin_file(PLUGIN) == (
        "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4",
        "main",
        "super_v3_reasoning_parser.py",
    )
    assert repos.plugin_file("https://example.com/x/y/raw/main/p.py") is None


def test_tokenizer_draft_and_plugin_from_other_repositories():
    p = variant(
        tokenizer="sparkcluster/testbed-tiny-tokenizer",
        speculative_config={
            "method": "draft_model",
            "model": "sparkcluster/testbed-tiny-draft",
            "revision": "v1",
            "num_speculative_tokens": 1,
        },
        reasoning_parser="x",
        reasoning_parser_plugin_url="https://huggingface.co/org/plugins/resolve/abc/p/x.py",
    )
    got = repos.needed(p)
    assert [n.describe() for n in got] == [
        "model sparkcluster/testbed-tiny@main",
        "tokenizer sparkcluster/testbed-tiny-tokenizer@main (without weight files)",
        "draft model sparkcluster/testbed-tiny-draft@v1",
        "reasoning-parser plugin org/plugins@abc (only p/x.py)",
    ]
    assert got[3].keeps("p/x.py") and not got[3].keeps("README.md")


def test_same_repository_for_tokenizer_and_draft_is_staged_once_with_weights():
    p = variant(tokenizer="org/shared", speculative_config={"method": "draft_model", "model": "org/shared"})
    got = repos.needed(p)
    assert [(n.roles, n.repo, n.weights) for n in got][1] == (("tokenizer", "draft model"), "org/shared", True)
    # the model's own repository as tokenizer: nothing more to stage
    assert len(repos.needed(variant(tokenizer="sparkcluster/testbed-tiny"))) == 1


def test_paths_inside_the_container_are_not_staged():
    p = variant(tokenizer="/models/tok", speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    assert [n.repo for n in repos.needed(p)] == ["sparkcluster/testbed-tiny"]


def plan_for(prof):
    inv = make_inventory()
    facts = {n.name: HostFacts(n.name, hostname=n.name) for n in inv.nodes}
    return make_plan(inv, prof, facts, serving=False, replace=False, secret_names=["HF_TOKEN"])


def test_dry_run_lists_each_repository():
    p = variant(
        tokenizer="sparkcluster/testbed-tiny-tokenizer",
        speculative_config={
            "method": "draft_model",
            "model": "sparkcluster/testbed-tiny-draft",
            "num_speculative_tokens": 1,
        },
    )
    plan = plan_for(p)
    steps = [s for s in plan.steps() if s.stage == "weights"]
    assert len({s.id for s in plan.steps()}) == len(plan.steps())
    resolve = [s.what for s in steps if s.action.startswith("resolve")]
    assert resolve == [
        "resolve the model sparkcluster/testbed-tiny@main to a commit on the hub",
        "resolve the tokenizer sparkcluster/testbed-tiny-tokenizer@main (without weight files) to a commit on the hub",
        "resolve the draft model sparkcluster/testbed-tiny-draft@main to a commit on the hub",
    ]
    assert [s.host for s in steps if s.action.startswith("check")] == ["spark-head", "spark-worker"] * 3
    assert [s.id for s in steps if s.host == "spark-worker" and s.action.startswith("replicate")] == [
        "weights/spark-worker/replicate",
        "weights/spark-worker/replicate-tokenizer",
        "weights/spark-worker/replicate-draft-model",
    ]
    assert [s.action for s in steps].count("disk") == 1 and [s.action for s in steps].count("hf-token") == 1
    downloads = [s.what for s in steps if s.action.startswith("download")]
    assert [t.split()[1] for t in downloads] == [
        "sparkcluster/testbed-tiny",
        "sparkcluster/testbed-tiny-tokenizer",
        "sparkcluster/testbed-tiny-draft",
    ]
    assert len([s for s in steps if s.action.startswith("replicate")]) == 3
    text = plan.render()
    for repo in ("testbed-tiny-tokenizer", "testbed-tiny-draft"):
        assert f"https://huggingface.co/api/models/sparkcluster/{repo}/revision/main" in text
    j = json.loads(plan.as_json())
    assert "sparkcluster/testbed-tiny-draft" in json.dumps(j)
    # every weights step comes before the first container is created
    ids = [s.stage for s in plan.steps()]
    assert max(i for i, st in enumerate(ids) if st == "weights") < ids.index("containers")


def test_plugin_from_the_hub_is_linked_by_the_weights_stage_not_fetched_in_the_container():
    plan = plan_for(profiles.load_profile("nemotron"))
    steps = plan.steps()
    links = [s for s in steps if s.stage == "weights" and s.action == "plugin"]
    assert [s.host for s in links] == ["spark-head", "spark-worker"]
    assert "/home/spark/.cache/huggingface/super_v3_reasoning_parser.py" in links[0].detail  # the user's cache
    assert not [s for s in steps if s.stage == "serve" and s.action == "plugin"]
    # a plugin elsewhere than the hub is still fetched by the serve stage
    other = variant("nemotron", reasoning_parser_plugin_url="https://example.com/p/super_v3_reasoning_parser.py")
    assert [s.action for s in plan_for(other).steps() if s.stage == "serve"].count("plugin") == 1
