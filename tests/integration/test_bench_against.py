"""Issue 38 on the testbed: `bench --compare` against a record of the testbed profile made on a healthy
run in the same test. Undisturbed, the comparison holds; with the link between the ranks delayed (tc
netem where the kernel has it, else the NFQUEUE stand-in of tests/testbed/delay.py), it falls short and
names the fabric first. The correctness canary: unchanged on a rerun, changed by another revision of
the model (the hub's `retrained` branch), and asked by the supervisor after its own restart.

One `up` for the module, a no-op when the cluster already serves `testbed` (test_bench's). The run is
short (c1, 64 in / 16 out, 4 prompts): the CPU engine's decode steps, not the prompt, are what the delay
slows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkcluster.bench import perf_record
from tests.integration.test_bench import EXTRA, HEAD
from tests.testbed import PROFILES as TESTBED_PROFILES

# `make test` keeps the healthy record with `--compare` holding against it, and the canary taken (issue 57);
# the rest is `make test-long`'s (tests/README.md)
pytestmark = pytest.mark.testbed
ROOT = Path(__file__).resolve().parents[2]
CONTROL_IF = "enp1s0f1np1"  # the testbed's control link: where gloo carries the ranks' traffic
SHORT = ["-c", "1", "--num-prompts", "4", "--input-len", "64", "--output-len", "16", *EXTRA]


@pytest.fixture(scope="module")
def serving(testbed, sc):
    res = sc("up", "--profile", "testbed", "--replace", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.fixture
def still_serving(testbed, sc, serving):
    """Serving now: a no-op `up` where it serves, else it brings back what a case before left
    restarting (the delayed link may end in a wedge verdict and a restart)."""
    testbed.unshape_egress(HEAD, CONTROL_IF)
    res = sc("up", "--profile", "testbed", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.fixture
def healthy_record(testbed, sc, serving, tmp_path):
    testbed.unshape_egress(HEAD, CONTROL_IF)
    res = sc("bench", *SHORT, "--repeat", "3", "--output", str(tmp_path / "healthy"), "--json", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    path = tmp_path / "healthy" / "record.perf.toml"
    rec = perf_record.load(path)
    (run,) = rec.runs
    assert run.repetitions == 3 and run.figures.decode_tok_s and rec.hardware.nodes == 2
    assert rec.software.profile == "testbed" and rec.software.image_ids and rec.software.model_revision
    return path


def against(sc, record, out, tolerance: str) -> dict:
    res = sc("bench", "--compare", str(record), "--tolerance", tolerance, "--output", str(out), "--json", timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)["against"]


def test_undisturbed_the_run_holds_against_the_healthy_record(sc, healthy_record, tmp_path):
    # the record's own conditions (c1, 64 in / 16 out) without typing them; two cores shared with the
    # engine make run-to-run noise large, hence the wide tolerance: the delayed case falls far below it
    got = against(sc, healthy_record, tmp_path / "again", "40")
    assert got["verdict"] == "ok", got
    assert {r["figure"] for r in got["ratios"]} >= {"decode_tok_s", "output_tok_s"} and not got["refused"]
    assert (tmp_path / "again" / "against.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_with_the_ranks_link_delayed_the_run_falls_short_and_names_the_fabric(testbed, sc, healthy_record, tmp_path):
    how = testbed.delay_egress(HEAD, CONTROL_IF)
    try:
        got = against(sc, healthy_record, tmp_path / "delayed", "40")
    finally:
        testbed.unshape_egress(HEAD, CONTROL_IF)
    assert got["verdict"] == "short", (how, got)
    decode = next(r for r in got["ratios"] if r["figure"] == "decode_tok_s")
    assert decode["short"] and decode["ratio"] < 0.6, (how, decode)
    first = got["causes"][0]
    assert first["area"] == "fabric" and first["node"] == "spark-worker", (how, got["causes"])
    assert "round trip between the ranks" in first["says"]


def test_the_canary_is_taken_and_a_rerun_of_the_same_model_is_unchanged(sc, still_serving):
    """The real engine's greedy answers with their token ids: taken (two passes, deterministic on the
    CPU build), then asked again: the same."""
    res = sc("bench", "--canary-retake", "--json", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    taken = json.loads(res.stdout)
    assert taken["canary"] == "taken" and taken["deterministic"] is True, taken
    res = sc("bench", "--canary", "--json", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["canary"] == "same"


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_another_revision_of_the_model_changes_the_canary_and_up_says_since_what(sc, still_serving, tmp_path):
    """The testbed hub's `retrained` branch of the tiny model (its output rows reversed: other greedy
    answers) served under the same profile name, so the same deployment: `up` fetches that revision,
    serves it and compares the canary taken on main: changed, since the model revision, in `up`'s
    output and `status`; back on main, the answers are the same again (the reference is main's until
    taken anew)."""
    from tests.testbed.hub import RETRAINED

    res = sc("bench", "--canary-retake", "--json", timeout=300)
    assert res.returncode == 0 and json.loads(res.stdout)["deterministic"] is True, res.stdout + res.stderr
    prof = tmp_path / "testbed.toml"  # the name is the deployment's: the same as the testbed's testbed.toml
    prof.write_text(f'revision = "{RETRAINED}"\n' + (TESTBED_PROFILES / "testbed.toml").read_text())
    try:
        res = sc("up", "--profile", str(prof), timeout=600)
        assert res.returncode == 0, res.stdout + res.stderr
        said = res.stdout + res.stderr  # up's progress lines are on stderr
        assert "canary answers changed after: model revision" in said, said
        canary = json.loads(sc("status", "--json").stdout)["canary"]
        assert canary["state"] == "changed" and canary["after"] == "up", canary
        assert any(s.startswith("model revision ") for s in canary["since"]), canary
    finally:
        res = sc("up", "--profile", "testbed", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    canary = json.loads(sc("status", "--json").stdout)["canary"]
    assert canary["state"] == "same", canary


@pytest.mark.long  # `make test-long`: `make test` keeps this module's other cases (tests/README.md, issue 57)
def test_after_a_restart_the_supervisor_asks_the_canary_and_status_tells_it(testbed, sc, still_serving):
    """Item 4 without the controller: the canary is taken (and its copy left in the head container),
    a killed rank makes the supervisor restart the engine, and once it serves again the supervisor asks
    the canary from inside the head container: the same model answers the same (the CPU build repeats
    itself), journalled as `canary: same` after a restart, and `status` shows that check."""
    import time

    from tests.integration.helpers import WORKER, journal, serving_again, wait_for
    from tests.integration.test_supervisor import rank1_pids

    res = sc("bench", "--canary-retake", "--json", timeout=300)
    assert res.returncode == 0 and json.loads(res.stdout)["deterministic"] is True, res.stdout + res.stderr
    t = time.time()
    testbed.sh(WORKER, "kill -KILL " + " ".join(rank1_pids(testbed)))
    serving_again(testbed, t, 240)

    def checked():
        return [e for e in journal(testbed) if e["ts"] > t and e["event"].startswith("canary: ")]

    got = wait_for(checked, 120, step=2.0)
    assert got and got[0]["event"] == "canary: same" and got[0]["after"] == "a restart", journal(testbed)[-10:]
    res = sc("status", "--json")
    canary = json.loads(res.stdout)["canary"]
    assert canary["state"] == "same" and canary["after"] == "a restart", canary


# Issue 58: a speculative profile compared on the record's dataset where the image has it. The testbed
# cannot serve a speculative profile (its tiny Llama has no draft heads, tests/integration/
# test_repos_offline.py), and the prompts a run sends depend only on the profile's speculative_config
# and the record's dataset (bench/prompts.choose): so the testbed profile, given one on the controller,
# where the record's dataset comes from for a speculative profile: the head image's bench is probed and
# the subset made from the hub the inventory names, the testbed hub's stand-in of nvidia/SPEED-Bench
# (tests/testbed/hub/speed_bench.py). The testbed's engine image cannot run the level itself (no
# pandas, below), so no level runs here. `long`: it brings the module's cluster up for itself.
@pytest.mark.long
def test_a_speculative_profiles_dataset_is_made_from_the_inventorys_hub_and_its_lack_said(testbed, serving, tmp_path):
    from sparkcluster.bench import prompts, runner
    from sparkcluster.config import inventory
    from sparkcluster.config import profile as profiles
    from tests.testbed import hub

    inv = inventory.load(Path(testbed.inventory))
    plain = profiles.load_profile(str(TESTBED_PROFILES / "testbed.toml"))
    spec = plain.model_copy(
        update={
            "serve": plain.serve.model_copy(
                update={"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}}
            )
        }
    )
    text = (TESTBED_PROFILES / "testbed.perf.toml").read_text()
    (tmp_path / "speed.perf.toml").write_text(
        text.replace('dataset = "random"', 'dataset = "nvidia/SPEED-Bench"\ndataset_subset = "throughput_8k"')
    )
    record = perf_record.load(tmp_path / "speed.perf.toml")
    cluster = runner.connect(inv)
    head = runner.head_for(cluster, inv)
    testbed.sh(
        HEAD, f"docker exec {head.container} sh -c 'rm -rf \"${{HF_HOME:-$HOME/.cache/huggingface}}/speed_bench\"'"
    )
    assert inv.cluster.hf_endpoint == hub.ENDPOINT
    sent = runner.prompt_set(head, record, spec, "vllm-bench-serve", inv.cluster.hf_endpoint)
    # vLLM 0.32's bench knows speed_bench but reads it with pandas, which the CPU wheel the testbed's
    # engine image installs does not pull in: random prompts, and the fallback says why
    assert not sent.speed_bench and sent.fallback == prompts.NO_PANDAS, sent.fallback
    assert runner.prompt_set(head, record, plain, "vllm-bench-serve") == prompts.PromptSet()  # not speculative
    # the subset is made in the head's HF cache from the inventory's hub (through the container's
    # HF_HUB_OFFLINE=1, lifted for that one exec), where the probe then finds it
    path, why = head.fetch_speed_bench("throughput_8k", inv.cluster.hf_endpoint)
    assert path and not why, why
    assert head.speed_bench("throughput_8k")[1] == path
    # a subset the stand-in holds only as placeholders is refused, saying why
    path, why = head.fetch_speed_bench("throughput_1k", inv.cluster.hf_endpoint)
    assert not path and "the hub's placeholder" in why, why
