"""Drift (issue 39): the trap probes' parsers on captured output, the known-bad list as data, and the
known-good record's diff. The checks themselves break one node each in test_checks (drift_fakes)."""

from __future__ import annotations

import subprocess

import pytest
from conftest import cap
from drift_fakes import FW, KERNEL_GOOD, KERNEL_KHO

from sparkcluster.config import known_bad
from sparkcluster.deployment import known_good
from sparkcluster.errors import InputError
from sparkcluster.facts import parsers, probes

# --- parsers and probes -------------------------------------------------------------------------------


def test_real_probe_output_of_a_vm_parses_to_what_it_has():
    # real: the drift probes run with bash on the dev VM (no DMI, no HCA, no GPU, earlyoom -r 0)
    t = probes.traits(probes.split_sections(cap("vm-traits-probe.txt")))
    assert t.kernel == "6.18.44-fc-v657"
    assert t.swap_total_kb == 0 and t.cma_total_kb is None  # a kernel without CMA prints no Cma lines
    assert t.bios_version == "" and t.hca_links == {} and t.gpu_clocks == [] and t.toolkit == ""
    assert (t.earlyoom.mem_pct, t.earlyoom.swap_pct, t.earlyoom.args) == (10, 10, "-r 0")


def test_kho_tell_from_the_published_meminfo():
    got = parsers.meminfo_kib(cap("gb10-meminfo-cma-kho.txt"))
    assert got == {"CmaTotal": 0, "CmaFree": 940604}


def test_nvidia_smi_clocks_real_h100_line():
    (g,) = parsers.gpu_clocks_csv(cap("h100-nvidia-smi-clocks.csv"))
    assert (g.sm_mhz, g.sm_max_mhz, g.temperature_c, g.pstate, g.reasons) == (345, 1980, 39, "P0", ("gpu_idle",))
    (na,) = parsers.gpu_clocks_csv("[N/A], [N/A], 41, P8, [N/A]\n")
    assert na.sm_mhz is None and na.reasons == ()


def test_hca_link_lines_documented_shape_and_a_missing_attribute():
    got = parsers.hca_link_lines(f"rocep1s0f1|4|32.0 GT/s PCIe|4|32.0 GT/s PCIe|{FW}\nroceP2p1s0f1|2|32 GT/s|4||{FW}\n")
    assert got["rocep1s0f1"].width == 4 and got["rocep1s0f1"].speed_gts == 32.0
    assert got["roceP2p1s0f1"].width == 2 and got["roceP2p1s0f1"].max_speed_gts is None


def test_hca_link_probe_reads_a_sysfs_tree(tmp_path):
    d = tmp_path / "rocep1s0f0"
    (d / "device").mkdir(parents=True)
    for name, v in (("current_link_width", "2"), ("current_link_speed", "32.0 GT/s PCIe"), ("max_link_width", "4")):
        (d / "device" / name).write_text(v + "\n")
    (d / "fw_ver").write_text(FW + "\n")
    cmd = probes.HCA_LINK.command.replace("/sys/class/infiniband", str(tmp_path))
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True).stdout
    x = probes.HCA_LINK.parse(out)["rocep1s0f0"]
    assert (x.width, x.speed_gts, x.max_width, x.max_speed_gts, x.fw) == (2, 32.0, 4, None, FW)


def test_earlyoom_args_forms():
    assert parsers.earlyoom_args("earlyoom -m 2 -s 80 --prefer x ").swap_pct == 80
    assert parsers.earlyoom_args("earlyoom -m2,1 -s80 ").mem_pct == 2
    assert parsers.earlyoom_args("earlyoom --swap=50 ").swap_pct == 50


def test_bios_date_and_dgx_release_and_toolkit():
    assert parsers.dmi_date("03/18/2026\n") == "2026-03-18" and parsers.dmi_date("garbage") == ""
    # documented shape of /etc/dgx-release (NVIDIA DGX OS user guide)
    kv = parsers.key_values('DGX_NAME="DGX Spark"\nDGX_SWBUILD_VERSION="7.2.3"\n# comment\n')
    assert kv["DGX_SWBUILD_VERSION"] == "7.2.3"
    assert parsers.toolkit_version("NVIDIA Container Toolkit CLI version 1.17.8\ncommit: x\n") == "1.17.8"


# --- the known-bad list ------------------------------------------------------------------------------


def test_shipped_list_validates_and_has_one_entry_per_trap():
    kb = known_bad.load()
    ids = {e.id for e in kb.entry}
    assert {"kernel-7.0-kho-cma", "cx7-pcie-narrow", "earlyoom-defaults-with-swap", "nccl-2.28.9-graph-hang"} <= ids
    # dropped after their sources were re-read (issue 51; the comment in known_bad.toml says why)
    assert not ids & {"bios-before-2026-04", "driver-590-cuda-graphs", "cx7-pcie-slow", "nccl-pip-2.28.9-hang"}
    # NVLS is NVLink SHARP, over NVLink only (NVIDIA/nccl#1031): Sparks meet over RoCE, and
    # NVIDIA/nccl#2167's reporter retracted NCCL_NVLS_ENABLE=0 as its fix
    assert "nccl-2.30.4-nvls-8-nodes" not in ids
    assert not any("NVLS" in e.fix or "NVLS" in e.why for e in kb.entry)
    assert all(e.why and e.fix and e.source for e in kb.entry)


def _cma(name: str) -> dict:
    """CmaTotal/CmaFree of a captured /proc/meminfo, as the host.kernel check's signals."""
    kv = {k: int(v.split()[0]) for k, v in (x.split(":") for x in cap(name).splitlines() if ":" in x)}
    return {
        "cma_total_kb": kv["CmaTotal"],
        "cma_free_kb": kv["CmaFree"],
        "cma_free_over_total_kb": kv["CmaFree"] - kv["CmaTotal"],
    }


def test_kho_entry_matches_the_tell_only():
    kb = known_bad.load()
    # NV-Kernels#590's form (CmaTotal 0: tests/captured/gb10-meminfo-cma-kho.txt, MiaAI-Lab #259 hfeixas)
    bad = {"kernel": KERNEL_KHO, **_cma("gb10-meminfo-cma-kho.txt")}
    assert [e.id for e in kb.matching("host.kernel", bad)] == ["kernel-7.0-kho-cma"]
    # MiaAI-Lab #259 zlylong's form: the 32 MiB cma= default kept, CmaFree 9.3 GiB above it
    kept = {"kernel": KERNEL_KHO, **_cma("gb10-meminfo-cma-kho-32mib.txt")}
    assert kept["cma_total_kb"] == 32768 and [e.id for e in kb.matching("host.kernel", kept)] == ["kernel-7.0-kho-cma"]
    # kho=off: CmaFree reads 0 (NV-Kernels#590), or a real CMA area partly used: free within total
    assert kb.matching("host.kernel", {**bad, "cma_free_kb": 0, "cma_free_over_total_kb": 0}) == []
    healthy_cma = {"cma_total_kb": 32768, "cma_free_kb": 30000, "cma_free_over_total_kb": -2768}
    assert kb.matching("host.kernel", {"kernel": KERNEL_KHO, **healthy_cma}) == []
    assert kb.matching("host.kernel", {**bad, "kernel": KERNEL_GOOD}) == []
    assert kb.matching("host.kernel", {"kernel": KERNEL_KHO}) == []  # unknown CMA is not bad


def test_nccl_failure_causes_carried_for_the_fabric_test():
    kb = known_bad.load()
    line = "spark-b:123:456 [0] NCCL WARN Call to ibv_modify_qp failed with 110 Connection timed out"
    assert [e.id for e in kb.matching("nccl.failure", {"log": line, "topology": "ring"})] == [
        "qp-timeout-point-to-point"
    ]
    assert [e.id for e in kb.matching("nccl.failure", {"log": line, "topology": "direct"})] == ["qp-timeout-pair"]
    enomem = "NCCL WARN Call to ibv_reg_mr_iova2 failed with error Cannot allocate memory"
    assert [e.id for e in kb.matching("nccl.failure", {"log": enomem})] == ["kernel-cma-regmr"]


def test_user_file_beside_the_inventory_extends_and_replaces(tmp_path):
    (tmp_path / "known_bad.toml").write_text(
        '[[entry]]\nid = "cx7-pcie-narrow"\ncheck = "rdma.pcie"\nseverity = "ok"\n'
        'when = { link_width = { lt = 4 } }\nwhy = "ours run at x2 on purpose"\nsource = ["the owner"]\nfix = "-"\n'
        '[[entry]]\nid = "our-kernel"\ncheck = "host.kernel"\nwhen = { kernel = { regex = "^6\\\\.17\\\\.0-1030" } }\n'
        'why = "hangs here"\nsource = ["our notes"]\nfix = "boot 1031"\n'
    )
    kb = known_bad.load(tmp_path / "cluster.toml")
    assert next(e for e in kb.entry if e.id == "cx7-pcie-narrow").severity == "ok"
    assert [e.id for e in kb.matching("host.kernel", {"kernel": "6.17.0-1030-nvidia"})] == ["our-kernel"]
    assert len(kb.entry) == len(known_bad.load().entry) + 1


@pytest.mark.parametrize(
    "text,says",
    [
        ('[[entry]]\nid = "x"\ncheck = "host.nope"\nwhen = {}\nwhy = "w"\nsource = ["s"]\nfix = "f"\n', "host.nope"),
        (
            '[[entry]]\nid = "x"\ncheck = "host.kernel"\nwhen = { knl = { eq = 1 } }\nwhy = "w"\nsource = ["s"]\nfix = "f"\n',
            "knl",
        ),
        (
            '[[entry]]\nid = "x"\ncheck = "host.kernel"\nwhen = { kernel = { like = "7" } }\nwhy = "w"\nsource = ["s"]\nfix = "f"\n',
            "like",
        ),
        (
            '[[entry]]\nid = "x"\ncheck = "host.kernel"\nwhen = { kernel = { eq = "7" } }\nwhy = "w"\nfix = "f"\n',
            "source",
        ),
        ("[[entry]\n", "not valid TOML"),
    ],
)
def test_a_bad_entry_is_an_error_naming_it(text, says):
    with pytest.raises(InputError) as e:
        known_bad.parse(text, "known_bad.toml")
    assert says in e.value.message and "known_bad.toml" in e.value.message


# --- the known-good record -----------------------------------------------------------------------------


def _rec(**nodes) -> known_good.GoodRecord:
    return known_good.GoodRecord(
        deployment="testbed@spark-a+spark-b",
        at="2026-11-20T09:00:00Z",
        profile="testbed",
        profile_hash="h",
        image="img",
        vllm_version="0.32.0",
        model="m",
        model_revision="abc",
        nodes=nodes,
    )


def test_drift_names_what_changed_node_by_node():
    rec = _rec(
        **{
            "spark-a": known_good.NodeRecord("6.17.0-1032-nvidia", "580.95.05", FW),
            "spark-b": known_good.NodeRecord("6.17.0-1032-nvidia", "580.95.05", FW),
        }
    )
    now = {
        "spark-a": known_good.NodeRecord("6.17.0-1032-nvidia", "580.95.05", FW),
        "spark-b": known_good.NodeRecord("7.0.0-1019-nvidia", "580.95.05", ""),  # firmware unknown now: not drift
    }
    (c,) = known_good.drift(rec, now)
    assert c.line() == "kernel 6.17.0-1032-nvidia -> 7.0.0-1019-nvidia on spark-b since the serve of 11-20"
    assert known_good.drift(rec, {"spark-a": now["spark-a"]}) == []


def test_history_is_short_and_newest_last(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    for i in range(known_good.HISTORY + 3):
        known_good.append("c", _rec(**{"spark-a": known_good.NodeRecord(kernel=f"k{i}")}))
    got = known_good.load("c")
    assert len(got) == known_good.HISTORY and got[-1].nodes["spark-a"].kernel == f"k{known_good.HISTORY + 2}"
    assert known_good.last_for_node(got, "spark-a") is got[-1] and known_good.last_for_node(got, "spark-z") is None


def test_doctor_rows_warn_on_the_drifted_node_only():
    from sparkcluster import facts

    def host(kernel: str) -> facts.HostFacts:
        f = facts.HostFacts(node="x")
        f.traits = parsers.Traits(kernel=kernel)
        return f

    rec = _rec(**{"spark-a": known_good.NodeRecord(KERNEL_GOOD), "spark-b": known_good.NodeRecord(KERNEL_GOOD)})
    rows = {
        r.node: r
        for r in known_good.doctor_results(
            "c", [rec], {"spark-a": host(KERNEL_GOOD), "spark-b": host(KERNEL_KHO)}, ["spark-a", "spark-b"]
        )
    }
    assert rows["spark-a"].status == "ok"
    assert (
        rows["spark-b"].status == "warn"
        and f"kernel {KERNEL_GOOD} -> {KERNEL_KHO} on spark-b" in rows["spark-b"].detail
    )
    assert rows["spark-b"].fix
    assert known_good.doctor_results("c", [], {"spark-a": host(KERNEL_GOOD)}, ["spark-a"])[0].status == "skip"
    assert known_good.doctor_results("c", [rec], {}, ["spark-b"])[0].detail == "unreachable"


def test_the_drift_pages_example_of_a_user_entry_loads():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "explanation" / "drift.md").read_text()
    start = text.index("# ~/.config/sparkcluster/known_bad.toml")
    kb = known_bad.parse(text[start : text.index("```", start)], "docs/explanation/drift.md")
    assert [e.id for e in kb.matching("host.kernel", {"kernel": "6.17.0-1030-nvidia"})] == ["our-kernel-1030"]


def test_status_says_what_changed_on_the_deployments_nodes(tmp_path, monkeypatch):
    from sparkcluster.status import status

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    img = "sha256:" + "a" * 64
    known_good.append(
        "c", _rec(**{n: known_good.NodeRecord(KERNEL_GOOD, image_id=img) for n in ("spark-a", "spark-b")})
    )
    st = status.ClusterStatus(
        "c",
        "healthy",
        [
            status.NodeStatus("spark-a", kernel=KERNEL_GOOD, image_id=img),
            status.NodeStatus("spark-b", kernel=KERNEL_KHO, image_id=img),
        ],
        deployment="testbed@spark-a+spark-b",
    )
    assert status._drift("c", st) == [f"kernel {KERNEL_GOOD} -> {KERNEL_KHO} on spark-b since the serve of 11-20"]
    st.deployment = "other@spark-a"
    assert status._drift("c", st) == []


def test_the_nccl_the_ranks_loaded_from_their_files():
    from pathlib import Path

    from sparkcluster.fabric import engine_nccl

    # real NCCL 2.28.9 output (tests/captured/nccl, two ranks on one H100 host)
    d = Path(__file__).resolve().parents[1] / "captured" / "nccl"
    text = (d / "device-socket-rank0.log").read_text()
    assert engine_nccl.versions({"spark-a": text, "spark-b": ""}) == {"spark-a": "2.28.9+cuda13.0"}
    assert engine_nccl.versions({"spark-a": ""}) == {}


# --- the image's NCCL ------------------------------------------------------------------------------

IMG_ID = "sha256:" + "c" * 64


def test_image_nccl_pip_wins_over_system_and_versions_are_plain():
    from sparkcluster.facts import image_nccl

    both = image_nccl.parse(f"id {IMG_ID}\npip 2.28.9\nsystem 2.28.9-1+cuda13.0\ncuda 13.0.1\n")
    assert (both.version, both.build, both.cuda) == ("2.28.9", "pip", "13.0.1")
    sys_only = image_nccl.parse(f"id {IMG_ID}\nsystem 2.27.7-1+cuda12.9\ncuda 12.9.1\n")
    assert (sys_only.version, sys_only.build) == ("2.27.7", "system")
    assert image_nccl.parse(f"id {IMG_ID}\ncuda \n").version == ""
    assert image_nccl.parse("Error: No such image\n") is None


def test_image_nccl_reads_nothing_of_this_vm_and_the_cache_skips_the_container(tmp_path, monkeypatch):
    from sparkcluster.facts import image_nccl

    # the in-image script, run here: no NCCL, no CUDA (real output of this dev VM)
    out = subprocess.run(["sh", "-c", image_nccl.INSIDE], capture_output=True, text=True, check=True).stdout
    assert image_nccl.parse(f"id {IMG_ID}\n{out}").build == ""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    found = image_nccl.parse(f"id {IMG_ID}\npip 2.28.9\ncuda 13.0.1\n")
    image_nccl.remember([found])
    cached = image_nccl.load()
    assert cached == {IMG_ID: "pip 2.28.9\ncuda 13.0.1\ndriver \nrequire \ncudacache "}
    cmd = image_nccl.probe("repo/img:tag", cached).command
    assert "case " in cmd and "docker run" in cmd  # the container only for an ID not in the cache
    # the cached answer, printed as the probe would, parses to what was read
    assert image_nccl.parse(f"id {IMG_ID}\n{cached[IMG_ID]}\n") == found


def test_known_bad_catches_any_2_28_9_build_across_nodes_with_the_fix_of_its_build():
    kb = known_bad.load()
    # vllm#52504: "NCCL 2.28.9 (as shipped)", 2x DGX Spark TP=2 with mp: the watchdog line it quotes
    assert "sample_tokens timed out" in cap("vllm-52504-watchdog.txt")
    pip = {"nccl_version": "2.28.9", "nccl_build": "pip", "nodes": 2}
    assert [e.id for e in kb.matching("image.nccl", pip)] == ["nccl-2.28.9-graph-hang"]
    system = {**pip, "nccl_build": "system"}
    assert [e.id for e in kb.matching("image.nccl", system)] == ["nccl-2.28.9-graph-hang-system"]
    (e,) = kb.matching("image.nccl", pip)
    assert "vllm-project/vllm#52504" in e.sources() and "--enforce-eager" in e.fix
    # the wheel is replaced with pip (vllm#40969 did, over the bundled 2.28.9)
    assert "pip install nvidia-nccl-cu13==2.30.4" in e.fix and "vllm-project/vllm#40969" in e.sources()
    # an NGC image loads the system libnccl2, which no pip wheel replaces: another image, or eager
    (e,) = kb.matching("image.nccl", system)
    assert "pip" not in e.fix and "libnccl2 is 2.30.4 or newer" in e.fix and "--enforce-eager" in e.fix
    assert "vllm-project/vllm#52504" in e.sources() and "vllm-project/vllm#41725" in e.sources()
    assert kb.matching("image.nccl", {**pip, "nodes": 1}) == []  # a cross-node replay: one node has none
    assert kb.matching("image.nccl", {**pip, "nccl_version": "2.30.4"}) == []


# --- the driver the image's CUDA needs ---------------------------------------------------------------


def _inside_with(env: dict[str, str]) -> str:
    """The in-image script run here with an image's environment (what `docker run` of it would give)."""
    from sparkcluster.facts import image_nccl

    return subprocess.run(
        ["sh", "-c", image_nccl.INSIDE],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", **env},
    ).stdout


def test_driver_need_read_from_a_real_ngc_environment():
    from drift_fakes import ngc_env

    from sparkcluster.facts import image_nccl

    # real: nvcr.io/nvidia/pytorch:25.10-py3's CUDA_VERSION, CUDA_DRIVER_VERSION and NVIDIA_REQUIRE_CUDA
    found = image_nccl.parse(f"id {IMG_ID}\n{_inside_with(ngc_env())}")
    assert (found.cuda, found.cuda_driver, found.require_cuda) == ("13.0.2.006", "580.95.05", "cuda>=9.0")
    # NGC's entrypoint compares branches; its `cuda>=9.0` is met by every driver that drives a GB10
    (need,) = image_nccl.driver_needs(found)
    assert (need.said, need.driver, need.branch) == ("CUDA_DRIVER_VERSION=580.95.05", "580", True)
    assert need.met_by("580.95.05") and need.met_by("580.82.09") and need.met_by("590.44.01")
    assert need.met_by("575.64.05") is False
    assert need.met_by("[N/A]") is None


def test_an_image_built_for_590_refuses_the_580_of_eugr_266():
    from sparkcluster.facts import image_nccl

    # eugr/spark-vllm-docker#266: "built for NVIDIA Driver Release 590.48 or later, but version 580.159.03
    # was detected" (the entrypoint prints CUDA_DRIVER_VERSION without its last part)
    found = image_nccl.parse(
        f"id {IMG_ID}\n{_inside_with({'CUDA_VERSION': '13.1.1', 'CUDA_DRIVER_VERSION': '590.48.01'})}"
    )
    (need,) = image_nccl.driver_needs(found)
    assert need.met_by("580.159.03") is False
    assert need.met_by("590.44.01") is True  # the same branch: the entrypoint lets it start


def test_cuda_base_image_requirement_only_its_cuda_term_counts():
    from sparkcluster.facts import image_nccl

    # real: NVIDIA_REQUIRE_CUDA of nvidia/cuda:12.0.0-base-ubuntu22.04 (trimmed): the brand= terms admit
    # older branches through forward compatibility, which a GB10 does not have; 12.0 is below every GB10 driver
    real = cap("cuda-12.0.0-base-require.txt").strip()
    old = image_nccl.parse(f"id {IMG_ID}\n{_inside_with({'NVIDIA_REQUIRE_CUDA': real})}")
    assert old.require_cuda == real and image_nccl.driver_needs(old) == []
    # the same shape for CUDA 13.1 (its images begin `cuda>=13.1`): the release notes' 590.44.01
    new = image_nccl.parse(
        f"id {IMG_ID}\n{_inside_with({'NVIDIA_REQUIRE_CUDA': real.replace('cuda>=12.0', 'cuda>=13.1')})}"
    )
    (need,) = image_nccl.driver_needs(new)
    assert (need.said, need.driver, need.branch) == ("NVIDIA_REQUIRE_CUDA cuda>=13.1", "590.44.01", False)
    assert need.met_by("580.95.05") is False and need.met_by("590.44.01") is True
    # a CUDA release newer than the table: said, but its lowest driver is unknown (not judged)
    (later,) = image_nccl.driver_needs(image_nccl.parse(f"id {IMG_ID}\nrequire cuda>=13.9\n"))
    assert later.driver == "" and later.met_by("580.95.05") is None


def test_what_was_remembered_before_the_driver_was_read_is_read_again(tmp_path, monkeypatch):
    import json

    from drift_fakes import healthy_image_nccl

    from sparkcluster.facts import image_nccl

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    image_nccl.path().parent.mkdir(parents=True, exist_ok=True)
    other = "sha256:" + "d" * 64
    image_nccl.path().write_text(json.dumps({other: "system 2.28.9\ncuda 13.0.1"}))
    assert image_nccl.load() == {}  # an entry of the older shape: the container reads it again
    found = healthy_image_nccl(IMG_ID)
    image_nccl.remember([found])
    assert image_nccl.parse(f"id {IMG_ID}\n{image_nccl.load()[IMG_ID]}\n") == found


def test_image_driver_judges_each_node_by_its_own_driver():
    import dataclasses

    from test_checks import H, W, healthy, results

    # issue 51: an image of 26.x's shape (CUDA 13.2, built for 595) on a pair whose head still runs a
    # 570 driver (CUDA 12.8) and whose worker runs DGX OS 7.5's 580.142: the head cannot start CUDA 13
    # (FAIL, newer major), the worker runs it in compatibility mode (WARN naming PTX JIT, vllm#47397)
    s = healthy()
    for n, drv in ((H, "570.124.06"), (W, "580.142")):
        f = s.facts[n]
        f.image_nccl = dataclasses.replace(f.image_nccl, cuda="13.2.1", cuda_driver="595.45.04")
        f.gpus = [dataclasses.replace(g, driver=drv) for g in f.gpus]
    got = results(s)
    r = got[("image.driver", W)]
    assert r.status == "warn" and "compatibility" in r.detail and "vllm-project/vllm#47397" in r.detail, r
    r = got[("image.driver", H)]
    assert r.status == "fail" and "CUDA 12.x at most, the image is CUDA 13" in r.detail, r
    assert "580 branch or later" in r.fix, r


def test_image_driver_skips_what_it_cannot_judge():
    import dataclasses

    from test_checks import W, healthy, results

    s = healthy()
    f = s.facts[W]
    f.image_nccl = dataclasses.replace(f.image_nccl, cuda_driver="", require_cuda="")
    assert results(s)[("image.driver", W)].status == "skip"  # a CPU image: no requirement
    s = healthy()
    for f in s.facts.values():
        f.image_nccl = None
    assert results(s)[("image.driver", W)].status == "skip"  # no node holds the image or its base


def test_a_node_without_the_image_yet_is_judged_by_what_the_head_read():
    import dataclasses

    from test_checks import H, W, healthy, results

    # before `up` sent the image (built for 590 on the head) the worker holds nothing to read
    s = healthy()
    s.facts[H].image_nccl = dataclasses.replace(s.facts[H].image_nccl, cuda_driver="590.48.01")
    s.facts[H].gpus = [dataclasses.replace(g, driver="590.48.01") for g in s.facts[H].gpus]
    s.facts[W].image_nccl = None
    got = results(s)
    r = got[("image.driver", W)]
    # the same CUDA major on the worker's 580: compatibility mode, said with where it was read
    assert r.status == "warn" and "(CUDA_DRIVER_VERSION=590.48.01 (read on spark-head): driver branch 590" in r.detail
    assert got[("image.driver", H)].status == "ok"


def test_the_probe_reads_the_base_where_the_cluster_image_is_not_built_yet(tmp_path):
    from drift_fakes import ngc_env

    from sparkcluster.facts import image_nccl

    # a `docker` that holds only the base image: inspect answers its ID, run executes the script with
    # the image's environment (the NGC 25.10 one)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    env_lines = " ".join(f"{k}={v}" for k, v in ngc_env().items())
    (bin_ / "docker").write_text(
        "#!/bin/sh\n"
        'if [ "$1" = image ]; then [ "$5" = base:1 ] && echo ' + IMG_ID + " && exit 0; exit 1; fi\n"
        'if [ "$1" = run ]; then shift 6; echo "ran $1" >&2; shift 2; exec env -i PATH=/usr/bin:/bin '
        + env_lines.replace(">", "\\>")
        + ' sh -c "$1"; fi\nexit 2\n'
    )
    (bin_ / "docker").chmod(0o755)
    env = {"PATH": f"{bin_}:/usr/bin:/bin"}

    def run(image, base):
        cmd = image_nccl.probe(image, None, base).command
        return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env)

    got = run("cluster:1-ray", "base:1")
    assert got.returncode == 0 and "ran base:1" in got.stderr, got.stderr
    found = image_nccl.parse(got.stdout)
    assert found.image_id == IMG_ID and found.cuda_driver == "580.95.05"
    assert run("cluster:1-ray", None).returncode == 3  # neither held: nothing to read


def test_an_unchanged_up_carries_the_ranks_nccl_instead_of_reading_their_files(monkeypatch):
    # issue 40 item 6: `up` on a serving cluster records the known-good serve again; the NCCL its
    # ranks loaded is the last record's (same profile, same image on every node), with no round trip
    from conftest import make_inventory

    from sparkcluster.config import profile as profiles
    from sparkcluster.up import bringup

    inv, prof = make_inventory(), profiles.load_profile("testbed")
    reads = []
    monkeypatch.setattr(bringup, "_nccl_loaded", lambda cluster, inv: reads.append(1) or {"spark-head": "2.28.9"})
    cluster = object()
    bringup.remember_good(inv, prof, {n.name: _facts(n.name) for n in inv.nodes}, "sha256:a", "r1", cluster)
    assert len(reads) == 1 and known_good.load(inv.cluster.name)[-1].nodes["spark-head"].nccl == "2.28.9"
    bringup.remember_good(
        inv, prof, {n.name: _facts(n.name) for n in inv.nodes}, "sha256:a", "", cluster, unchanged=True
    )
    assert len(reads) == 1 and known_good.load(inv.cluster.name)[-1].nodes["spark-head"].nccl == "2.28.9"
    # another image on the nodes: read again
    bringup.remember_good(
        inv, prof, {n.name: _facts(n.name) for n in inv.nodes}, "sha256:b", "", cluster, unchanged=True
    )
    assert len(reads) == 2


def _facts(node: str):
    from sparkcluster.facts import HostFacts

    return HostFacts(node, hostname=node)


# --- the CUDA driver's JIT cache in the serving container ------------------------------------------


def test_the_probe_reads_cuda_cache_disable_and_says_what_it_means():
    """CUDA Programming Guide, "CUDA Environment Variables": CUDA_CACHE_DISABLE=1 stops the driver adding
    to or reading its JIT cache, 0 (the default) keeps it; the compile cache points CUDA_CACHE_PATH at the
    key's cuda folder for the PTX GB10 JIT-compiles (vllm-project/vllm#47397)."""
    from sparkcluster.facts import image_nccl

    env = {"CUDA_CACHE_DISABLE": "1"}
    out = subprocess.run(["sh", "-c", image_nccl.INSIDE], capture_output=True, text=True, check=True, env=env).stdout
    found = image_nccl.parse(f"id {IMG_ID}\n{out}")
    assert found.cuda_cache_disable == "1"
    on, said = image_nccl.cuda_cache(found)
    assert not on and said.startswith("the image sets CUDA_CACHE_DISABLE=1: the CUDA driver neither adds to nor reads")
    assert "CUDA_CACHE_PATH" in said and "CUDA Programming Guide" in said and "vllm-project/vllm#47397" in said
    # the profile's forwarded value is the one the container gets
    on, said = image_nccl.cuda_cache(found, "0")
    assert on and said.startswith("the profile forwards CUDA_CACHE_DISABLE=0: the CUDA driver keeps")
    # unset: the driver's default, the cache on
    unset = image_nccl.parse(
        f"id {IMG_ID}\n{subprocess.run(['sh', '-c', image_nccl.INSIDE], capture_output=True, text=True, env={}).stdout}"
    )
    assert image_nccl.cuda_cache(unset) == (True, image_nccl.cuda_cache(unset)[1])
    assert image_nccl.cuda_cache(unset)[1].startswith("the image leaves CUDA_CACHE_DISABLE unset")
    # what the controller remembers says it again, and an entry from before it was read is read again
    assert image_nccl.parse(f"id {IMG_ID}\n{image_nccl.lines(found)}\n") == found


def test_image_cuda_cache_warns_where_the_image_turns_the_jit_cache_off():
    import dataclasses

    from test_checks import H, W, healthy, results

    s = healthy()
    assert results(s)[("image.cuda_cache", W)].status == "ok"  # the healthy image leaves it unset
    for f in s.facts.values():
        f.image_nccl = dataclasses.replace(f.image_nccl, cuda_cache_disable="1")
    got = results(s)
    r = got[("image.cuda_cache", W)]
    assert r.status == "warn" and "stays empty" in r.detail and "CUDA_CACHE_DISABLE=0" in r.fix, r
    # a profile that forwards 0 keeps the cache whatever the image says
    s.expect["forwarded_env"] = {"CUDA_CACHE_DISABLE": "0"}
    assert results(s)[("image.cuda_cache", H)].status == "ok"
    # a node that cannot be read is judged by another's reading of the same image, as image.driver is
    s.facts[H].image_nccl = None
    r = results(s)[("image.cuda_cache", H)]
    assert r.status == "ok" and f"(read on {W})" in r.detail, r
    for f in s.facts.values():
        f.image_nccl = None
    assert results(s)[("image.cuda_cache", H)].status == "skip"
