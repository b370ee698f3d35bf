"""A tiny in-tree PEP 517 build backend (stdlib only) for the vLLM test double.

It lets `pip install /path/to/tests/testbed/standins/vllm` work with no package index and no
setuptools/wheel installed (build isolation or not): the wheel is zipped here by hand.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile

NAME = "vllm_standin"
DIST = "vllm_standin"
VERSION = "0.21.0"
TAG = "py3-none-any"
HERE = os.path.dirname(os.path.abspath(__file__))

METADATA = f"""Metadata-Version: 2.1
Name: vllm-standin
Version: {VERSION}
Summary: Test double of vLLM 0.21 for the sparkcluster testbed (not vLLM)
Requires-Python: >=3.10
"""
WHEEL = f"""Wheel-Version: 1.0
Generator: standin_build
Root-Is-Purelib: true
Tag: {TAG}
"""
ENTRY_POINTS = """[console_scripts]
vllm = vllm_standin.cli:main
"""


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def _dist_info_files() -> dict[str, bytes]:
    di = f"{DIST}-{VERSION}.dist-info"
    return {
        f"{di}/METADATA": METADATA.encode(),
        f"{di}/WHEEL": WHEEL.encode(),
        f"{di}/entry_points.txt": ENTRY_POINTS.encode(),
        f"{di}/top_level.txt": f"{NAME}\n".encode(),
    }


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    for rel, data in _dist_info_files().items():
        path = os.path.join(metadata_directory, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return f"{DIST}-{VERSION}.dist-info"


def _package_files() -> dict[str, bytes]:
    out = {}
    pkg = os.path.join(HERE, NAME)
    for fn in sorted(os.listdir(pkg)):
        if fn.endswith(".py"):
            with open(os.path.join(pkg, fn), "rb") as f:
                out[f"{NAME}/{fn}"] = f.read()
    return out


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = {**_package_files(), **_dist_info_files()}
    record_name = f"{DIST}-{VERSION}.dist-info/RECORD"
    record = "".join(f"{p},{_digest(d)},{len(d)}\n" for p, d in files.items()) + f"{record_name},,\n"
    files[record_name] = record.encode()
    name = f"{DIST}-{VERSION}-{TAG}.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            z.writestr(p, d)
    return name


def build_sdist(sdist_directory, config_settings=None):
    import tarfile

    base = f"{DIST}-{VERSION}"
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ("pyproject.toml", "standin_build.py", "README.md"):
            if os.path.exists(os.path.join(HERE, rel)):
                t.add(os.path.join(HERE, rel), f"{base}/{rel}")
        t.add(os.path.join(HERE, NAME), f"{base}/{NAME}", filter=lambda ti: None if "__pycache__" in ti.name else ti)
    return name
