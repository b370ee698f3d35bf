"""The compile caches and the image (issue 58 item 2), on the testbed with the test double (profile
testbed-standin: it compiles nothing, so only the folders and their records are asserted):

- the key is of the image's ID: the key's `key.json` on each node names the ID the head holds;
- each node agent seeds the key's first start from the image's default cache places (a `compile cache
  seeded` journal entry, whatever it found to copy);
- GB10's other JIT caches are pointed into the key's folder (`CUDA_CACHE_PATH`, `TVM_FFI_CACHE_DIR`,
  `TORCH_EXTENSIONS_DIR`, `CUTE_DSL_CACHE_DIR`, `B12X_COMPILE_CACHE_DIR`), b12x's extension build left
  in the container;
- eviction never removes a key a running container uses: the cap's program, run as the SSH user with a
  cap of one byte for another key, keeps the running key and says why; once `down` has stopped the
  containers, `down --purge-caches` removes it.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from sparkcluster.deployment import compile_caches
from tests.integration import helpers
from tests.integration.helpers import HEAD, HEAD_C, WORKER, as_user, journal

pytestmark = [pytest.mark.testbed]
PROFILE = "testbed-standin"


def cache_root() -> str:
    return os.path.join(helpers.account()["home"], ".cache/sparkcluster/compile")


def keys_on(testbed, host: str) -> list[str]:
    out = testbed.sh(host, as_user(f"ls {cache_root()} 2>/dev/null || true"), check=False).stdout
    return [k for k in out.split() if re.fullmatch(r"[0-9a-f]{16}", k)]


def container_env(testbed, host: str, container: str) -> dict[str, str]:
    out = testbed.docker(host, f"inspect --format '{{{{json .Config.Env}}}}' {container}").stdout
    return dict(e.split("=", 1) for e in json.loads(out))


def test_the_key_follows_the_image_id_is_seeded_and_is_never_evicted_while_used(testbed, sc):
    sc("down", "--purge-caches", timeout=300)  # from nothing: a key kept by an earlier module is seeded already
    assert keys_on(testbed, HEAD) == []
    res = sc("up", "--profile", PROFILE, "--replace", timeout=900)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    try:
        image = testbed.docker(HEAD, f"inspect --format '{{{{.Config.Image}}}}' {HEAD_C}").stdout.strip()
        image_id = testbed.image_id(HEAD, image)
        (key,) = keys_on(testbed, HEAD)
        about = json.loads(testbed.sh(HEAD, as_user(f"cat {cache_root()}/{key}/key.json")).stdout)
        assert about["image_id"] == image_id and about["image"] == image, about
        assert keys_on(testbed, WORKER) == [key]  # the worker runs the head's image: the same key

        # the first start of the key was seeded from the image (whatever the double's image holds)
        assert helpers.wait_for(lambda: [e for e in journal(testbed) if e.get("event") == "compile cache seeded"], 60)

        env = container_env(testbed, HEAD, HEAD_C)
        folder = f"{cache_root()}/{key}"
        for var, sub in {
            "CUDA_CACHE_PATH": "cuda",
            "TVM_FFI_CACHE_DIR": "tvm-ffi",
            "TORCH_EXTENSIONS_DIR": "torch-extensions",
            "CUTE_DSL_CACHE_DIR": "cute-dsl",
        }.items():
            assert env[var] == f"{folder}/{sub}", (var, env.get(var))
        assert env["B12X_COMPILE_CACHE_DIR"] == f"{folder}/b12x", env.get("B12X_COMPILE_CACHE_DIR")
        assert env["B12X_TRELLIS_BUILD_DIR"] == "/root/.cache/b12x/trellis_build"

        # the cap of one byte for another key: the running one stays, and the program says why
        other = "f" * 16
        got = testbed.sh(HEAD, as_user(compile_caches.prepare_command(cache_root(), other, 1, {})), check=False)
        doc = json.loads(got.stdout.strip().splitlines()[-1])
        assert key not in [e["key"] for e in doc["evicted"]], doc
        assert f"{key}: in use by a running container (kept)" in doc["errors"], doc
        assert key in keys_on(testbed, HEAD)
    finally:
        res = sc("down", "--purge-caches", timeout=300)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    assert keys_on(testbed, HEAD) == []  # no container holds it any more
