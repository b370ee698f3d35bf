"""Three workers on 127.0.0.2-4 and a head on 127.0.0.1, each with a fake docker of its own."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

from test_image_send import CLASSIC, FAKE_DOCKER, HEAD_ID, SAVED, Host

from sparkcluster.facts import HostFacts
from sparkcluster.movement.layers import ImageLayers
from sparkcluster.up.stages.image import HeadImage

IPS = {"head": "127.0.0.1", "w1": "127.0.0.2", "w2": "127.0.0.3", "w3": "127.0.0.4"}


def world3(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(FAKE_DOCKER)
    (bindir / "docker").chmod(0o755)
    (bindir / "python3").symlink_to(sys.executable)
    hosts, dirs = {}, []
    for n in IPS:
        d = tmp_path / n
        d.mkdir()
        (d / "image.tar").write_bytes(SAVED)
        env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_DIR": str(d)}
        hosts[n] = Host(
            n, env, (lambda d=d: HEAD_ID if (d / "loaded-ok").exists() else None) if n != "head" else (lambda: HEAD_ID)
        )
        if n != "head":
            dirs.append(d)
    nodes = {n: SimpleNamespace(name=n, control_ip=ip, netdevs=[]) for n, ip in IPS.items()}
    facts = {n: HostFacts(n, docker=CLASSIC) for n in IPS}
    facts["head"].image_id = HEAD_ID
    facts["head"].image_layers = ImageLayers(HEAD_ID, (), ())
    inv = SimpleNamespace(head=nodes["head"], node=nodes.get, workers=[nodes[w] for w in ("w1", "w2", "w3")])
    state = {}
    r = SimpleNamespace(
        cluster=SimpleNamespace(head=hosts["head"], hosts=hosts),
        facts=facts,
        inv=inv,
        plan=SimpleNamespace(image="img:1", send_to=["w1", "w2", "w3"]),
        progress=SimpleNamespace(bytes=lambda *a: None),
        find=lambda kind: state.get(
            kind, HeadImage({"Id": HEAD_ID, "Size": 400_000, "RootFS": {"Layers": []}}) if kind is HeadImage else None
        ),
        put=lambda v: state.setdefault(type(v), v),
    )
    return r, dirs, hosts["head"]
