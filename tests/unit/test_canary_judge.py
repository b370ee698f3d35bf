"""The canary judges what an upgrade promises (issue 58 item 1): the same token IDs across restarts of
one image; across an image change agreement over the first IMAGE_CHANGE_AGREEMENT of each answer (vLLM
repeats itself only on the same version and hardware: docs.vllm.ai, usage/reproducibility); and, for a
profile that enables tool calls or a reasoning parser, one chat request of each kind answering a
well-formed 200."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_inventory
from test_upgrade import GOOD, NEW_IMAGE, Calls, _upgrade, local_locks, record  # noqa: F401 - the autouse fixture

from sparkcluster.config import profile as profiles
from sparkcluster.config.flags import supervised_argv
from sparkcluster.deployment import known_good
from sparkcluster.node import canary
from sparkcluster.upgrade import upgrade

IDS = tuple(range(100, 116))  # 16 greedy token IDs, as the canary asks


def rec(answers, image_id="sha256:old", deterministic=True) -> canary.CanaryRecord:
    return canary.CanaryRecord("d", "p", "t", deterministic, answers, image_id=image_id)


def answers(ids) -> list[canary.Answer]:
    return [canary.Answer(p, " ".join(map(str, ids)), tuple(ids)) for p in canary.PROMPTS]


def split_at(k: int) -> tuple[int, ...]:
    """The same first k tokens, then others (what another image's rounding does to a greedy answer)."""
    return IDS[:k] + tuple(i + 1000 for i in IDS[k:])


# ---- the tolerant judge -------------------------------------------------------------------------


def test_one_image_across_restarts_must_repeat_every_token():
    got = canary.compare(rec(answers(IDS)), answers(split_at(15)))
    assert got.state == "changed" and "across the image change" not in got.says
    assert canary.compare(rec(answers(IDS)), answers(IDS)).state == "same"


def test_across_an_image_change_the_first_share_of_each_answer_must_agree():
    k = int(canary.MAX_TOKENS * canary.IMAGE_CHANGE_AGREEMENT)
    kept = canary.compare(rec(answers(IDS)), answers(split_at(k)), image_changed=True)
    assert kept.state == "same" and "agree across the image change" in kept.says
    lost = canary.compare(rec(answers(IDS)), answers(split_at(k - 1)), image_changed=True)
    assert lost.state == "changed" and "across the image change" in lost.says
    # one prompt that splits early is enough
    mixed = answers(IDS)
    mixed[1] = canary.Answer(mixed[1].prompt, "x", split_at(2))
    assert canary.compare(rec(answers(IDS)), mixed, image_changed=True).changed == (1,)


def test_the_threshold_is_a_named_constant_measured_on_a_small_confident_model_so_far():
    # perf/canary_agreement.md: numeric-only changes kept >= 81% of an answer for 95% of prompts on a
    # small trained model on the GPU machine; perf/canary_agreement_tiny.md: the same on the testbed's
    # trained tiny model (below)
    assert canary.IMAGE_CHANGE_AGREEMENT == 0.5
    assert 0 < canary.IMAGE_CHANGE_AGREEMENT <= 1


NUMERIC = ("bf16 weights", "bf16 autocast", "batch of 8", "one thread")


def test_the_threshold_keeps_numeric_changes_and_refuses_damage_on_the_testbeds_trained_model():
    # perf/canary_agreement_tiny.json: `python -m perf.canary_agreement_tiny` on the testbed (the trained
    # tiny model, tests/testbed/model/train_tiny_model.py), measured with this very threshold; on prompts
    # the model knows (as a real model knows the canary's), numeric-only changes keep the first half of
    # 95% of answers, while weights broken by 10% noise lose it in at least half of them
    got = json.loads((Path(__file__).resolve().parents[2] / "perf" / "canary_agreement_tiny.json").read_text())
    assert got["threshold"] == canary.IMAGE_CHANGE_AGREEMENT, "measure again: python -m perf.canary_agreement_tiny"
    assert got["max_tokens"] == canary.MAX_TOKENS
    seen = got["sets"]["seen"]["changes"]
    for name in NUMERIC:
        assert seen[name]["p5"] >= canary.IMAGE_CHANGE_AGREEMENT, name
    assert seen["weights + 10% noise"]["refused"] >= 0.5
    assert seen["weights + 30% noise"]["refused"] >= 0.9


def test_agreement_is_the_common_prefix_share_of_ids_or_words():
    a = canary.Answer("p", "a b c d", (1, 2, 3, 4))
    assert a.agreement(canary.Answer("p", "", (1, 2, 9, 4))) == 0.5  # a later match does not count
    assert a.agreement(canary.Answer("p", "a b c x", None)) == 0.75  # no IDs: the words
    assert canary.Answer("p", "", ()).agreement(canary.Answer("p", "", ())) == 1.0


def test_the_judge_reads_an_image_change_from_the_provenance():
    stored = rec(answers(IDS), image_id="sha256:old")
    fresh = answers(split_at(12))
    assert canary.judge(stored, lambda: fresh, image_id="sha256:old").state == "changed"  # a restart
    assert canary.judge(stored, lambda: fresh, image_id="sha256:new").state == "same"  # another image
    assert canary.judge(rec(answers(IDS), image_id=""), lambda: fresh, image_id="sha256:new").state == "changed"


def test_a_nondeterministic_model_is_still_only_told():
    got = canary.compare(rec(answers(IDS), deterministic=False), answers(split_at(1)), image_changed=True)
    assert got.state == "differs" and not got.problem


# ---- the chat paths ------------------------------------------------------------------------------


def with_serve(prof: profiles.Profile, **serve) -> profiles.Profile:
    return prof.model_copy(update={"serve": prof.serve.model_copy(update=serve)})


def test_the_kinds_follow_the_profiles_flags():
    prof = profiles.load_profile("testbed-standin")
    assert canary.chat_kinds(supervised_argv(prof)) == ()
    tools = with_serve(prof, enable_auto_tool_choice=True, tool_call_parser="hermes")
    assert canary.chat_kinds(supervised_argv(tools)) == ("tools",)
    both = with_serve(tools, reasoning_parser="deepseek_r1")
    assert canary.chat_kinds(supervised_argv(both)) == ("tools", "reasoning")
    assert canary.chat_kinds(["vllm", "serve", "m", "--reasoning-parser=qwen3"]) == ("reasoning",)


def test_the_tools_request_carries_one_function_and_auto_choice():
    body = canary.chat_body("tools", "m")
    assert body["tool_choice"] == "auto" and body["tools"][0]["function"]["name"] == "get_weather"
    assert body["temperature"] == 0 and body["messages"][0]["role"] == "user"
    assert "tools" not in canary.chat_body("reasoning", "m")


# vLLM's chat completion as its OpenAI server answers it (the fields sparkcluster reads); the stand-in
# answers the same shape (tests/testbed/standins/vllm/vllm_standin/api_server.py)
def chat_doc(**message) -> str:
    msg = {"role": "assistant", "content": None, "tool_calls": [], "reasoning_content": None, **message}
    return json.dumps({"object": "chat.completion", "choices": [{"index": 0, "message": msg}]})


@pytest.mark.parametrize(
    "kind, status, body, why",
    [
        ("tools", 200, chat_doc(content="It is sunny."), ""),
        (
            "tools",
            200,
            chat_doc(tool_calls=[{"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]),
            "",
        ),
        ("reasoning", 200, chat_doc(content="42", reasoning_content="17 + 25"), ""),
        # NGC 26.07 (vLLM 0.24.0, xgrammar 0.2.0) on every request with `tools`: docs/field-notes.md
        (
            "tools",
            500,
            json.dumps(
                {
                    "error": {
                        "message": "cannot import name 'normalize_tool_choice'",
                        "type": "InternalServerError",
                        "param": None,
                        "code": 500,
                    }
                }
            ),
            "answered HTTP 500",
        ),
        ("tools", 200, "not json", "no chat completion"),
        ("tools", 200, json.dumps({"choices": []}), "no chat completion"),
        ("tools", 200, chat_doc(content=7), "not an assistant's text"),
        ("tools", 200, chat_doc(tool_calls=[{"function": {"name": "f", "arguments": {}}}]), "tool calls are malformed"),
        ("reasoning", 200, chat_doc(content="x", reasoning_content=["a"]), "reasoning is not text"),
    ],
)
def test_a_chat_answer_must_be_a_well_formed_200(kind, status, body, why):
    got = canary.chat_problem(kind, status, body)
    assert (why in got and got) if why else got == ""


# ---- in the upgrade ------------------------------------------------------------------------------


@pytest.fixture
def inv():
    return make_inventory()


@pytest.fixture
def tools_prof() -> profiles.Profile:
    return with_serve(profiles.load_profile("testbed-standin"), enable_auto_tool_choice=True, tool_call_parser="hermes")


def test_an_image_that_fails_tool_requests_is_rolled_back(inv, tools_prof, monkeypatch):
    known_good.append(inv.cluster.name, record(tools_prof))
    calls = Calls(monkeypatch)
    asked = []
    why = "the tools chat request answered HTTP 500: cannot import name 'normalize_tool_choice'"
    monkeypatch.setattr(upgrade.endpoint, "ask_chat", lambda *a, **k: asked.append(a[-1]) or why)
    with pytest.raises(upgrade.UpgradeRefused, match="refused and rolled back") as e:
        _upgrade(inv, tools_prof)
    assert asked == ["tools"] and "HTTP 500" in e.value.message
    assert calls.ups == [NEW_IMAGE, tools_prof.image.ref]


def test_an_image_that_changes_numerics_only_is_kept(inv, tools_prof, monkeypatch):
    known_good.append(inv.cluster.name, record(tools_prof))
    late = [canary.Answer(a.prompt, "Paris was", (1, 2, 9)) for a in GOOD]  # 2 of 3 tokens agree
    calls = Calls(monkeypatch, answers=late)
    monkeypatch.setattr(upgrade.endpoint, "ask_chat", lambda *a, **k: "")
    _upgrade(inv, tools_prof)
    assert calls.ups == [NEW_IMAGE]  # no rollback
    (outcome,) = known_good.load_outcomes(inv.cluster.name)
    assert outcome.outcome == "kept"


def test_the_same_image_must_still_repeat_itself_exactly(inv, tools_prof):
    good = record(tools_prof)
    r = type("R", (), {"good": good, "old": tools_prof, "new": tools_prof})()
    assert upgrade.image_changed(r) is False
    r.new = upgrade.with_image(tools_prof, NEW_IMAGE)
    assert upgrade.image_changed(r) is True


def test_the_plan_says_which_rule_and_which_chat_requests(inv, tools_prof):
    good = record(tools_prof)
    new = upgrade.with_image(tools_prof, NEW_IMAGE)
    steps = upgrade.upgrade_steps(inv, inv.head.name, new, tools_prof, good, upgrade.SPEED_BOUND)
    answers_step = next(s for s in steps if s.stage == "canary" and s.action == "answers")
    assert "one chat request of each kind the profile enables (tools)" in answers_step.what
    assert "across an image change" in answers_step.detail and "well-formed 200" in answers_step.detail
