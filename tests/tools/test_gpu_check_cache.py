"""The prebuilt Triton cache of a lease (tools/gpu_check/triton_cache.py, triton_prebuild.py, cache_step.py).

The plan of the lease's launches on meta tensors, the manifest's encoding, and a real prebuild with
this machine's triton (for sm_90, no GPU) that a second process, after installing the cache in
another folder, loads without compiling anything: the cache key survives the move and the pruning.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from tools.gpu_check import cache_step, triton_prebuild

REPO = pathlib.Path(__file__).resolve().parents[2]

pytest.importorskip("triton")


def test_encoding_round_trips_tensors_tuples_and_scalars():
    from tools.gpu_check.triton_cache import encode

    args = (torch.empty(2, 3, device="meta", dtype=torch.bfloat16), (6, 192, 1), 0.125, 7, None, True)
    decoded = [triton_prebuild.decode(json.loads(json.dumps(encode(a)))) for a in args]
    assert str(decoded[0].dtype) == "torch.bfloat16" and decoded[0].data_ptr() == 0
    assert decoded[1:] == [(6, 192, 1), 0.125, 7, None, True]
    again = triton_prebuild.decode(encode(torch.empty(1, device="meta", dtype=torch.bfloat16)))
    assert again.dtype is decoded[0].dtype  # one dtype object per name: Triton caches per object


def test_the_plan_holds_the_model_layer_and_the_core_parts_launches(tmp_path):
    # one model layer (both core kernels and the predictor) and one core shape (both core kernels)
    code = (
        "import json, sys\n"
        "from tools.kernel_audit import LayerShape\n"
        "from tools.gpu_check import core, triton_cache\n"
        "deit_layer = LayerShape(128, (14, 14), 1, 6, 32, 'bfloat16')\n"
        "rows = triton_cache.planned_launches([deit_layer], core.CORE_SHAPES[:1])\n"
        "json.dump(rows, open(sys.argv[1], 'w'))\n"
    )
    out = tmp_path / "plan.json"
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))
    proc = subprocess.run([sys.executable, "-c", code, str(out)], env=env, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    kernels = sorted({r["kernel"] for r in rows})
    assert kernels == [
        "inline_bwd_resident",
        "inline_bwd_stream",
        "inline_fwd_resident",
        "inline_fwd_stream",
        "predictor_bwd",
        "predictor_bwd_merge",
        "predictor_fwd",
    ]
    stream = next(r for r in rows if r["kernel"] == "inline_fwd_stream")
    assert stream["args"][0] == {"tensor": "bfloat16"}
    assert stream["args"][8] == {"tuple": [197, 192, 14, 14, 1, 6]}  # geo
    assert stream["meta"]["NARROW"] is True and stream["meta"]["num_warps"] == 2


PREBUILD_AND_LOAD = """
import json, os, pathlib, shutil, sys, time
from tools.gpu_check import triton_prebuild as tp
manifest, built, moved = (pathlib.Path(a) for a in sys.argv[1:4])
if sys.argv[4] == "build":
    print(json.dumps(tp.build(manifest, built)))
else:
    record = tp.install(built, moved)
    shutil.rmtree(built)  # the cache is read from its new place only
    os.environ["TRITON_CACHE_DIR"] = str(moved)
    from triton.runtime.driver import driver
    driver.set_active(tp._Driver(90))
    kernels, before = tp._kernels(), tp.entries(moved)
    for launch in json.loads(manifest.read_text())["launches"]:
        kernels[launch["kernel"]].warmup(*map(tp.decode, launch["args"]), grid=(1,), **launch["meta"])
    print(json.dumps({"new": tp.entries(moved) - before, "record": record}))
"""


def test_a_prebuilt_cache_moved_and_pruned_still_hits(tmp_path):
    st = lambda: {"tuple": [6 * 16 * 3, 3 * 16, 1]}  # noqa: E731 - a stride triple of a qkv view
    launch = {
        "kernel": "inline_fwd_stream",
        "args": [{"tensor": "float32"}] * 5 + [st(), st(), st(), {"tuple": [16, 16, 4, 4, 0, 1]}, 0.25],
        "meta": dict(D=16, BD=16, BLOCK_N=32, HAS_RES=True, NARROW=False, PREC="ieee", num_warps=8, num_stages=1),
    }
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"target": 90, "launches": [launch]}))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("TRITON_INTERPRET", None)
    args = [str(manifest), str(tmp_path / "built"), str(tmp_path / "moved")]
    for step in ("build", "load"):
        cmd = [sys.executable, "-c", PREBUILD_AND_LOAD, *args, step]
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout.splitlines()[-1])
        if step == "build":
            assert result["configurations"] == 1 and result["target"] == 90
            kept = sorted(p.suffix for p in (tmp_path / "built").glob("*/*") if not p.name.startswith("__grp__"))
            assert kept == [".cubin", ".json"]  # the intermediate files are dropped
    assert result["new"] == 0  # loaded from the moved cache, nothing compiled


def test_install_rewrites_the_group_files_to_the_new_place(tmp_path):
    old = tmp_path / "old" / "ABC"
    old.mkdir(parents=True)
    for name in ("k.cubin", "k.json"):
        (old / name).write_text("x")
    (old / "__grp__k.json").write_text(
        json.dumps({"child_paths": {n: f"/elsewhere/ABC/{n}" for n in ("k.cubin", "k.json")}})
    )
    (tmp_path / "old" / triton_prebuild.RECORD).write_text(json.dumps({"configurations": 1}))
    assert triton_prebuild.install(tmp_path / "old", tmp_path / "new") == {"configurations": 1}
    children = json.loads((tmp_path / "new" / "ABC" / "__grp__k.json").read_text())["child_paths"]
    assert children == {n: str(tmp_path / "new" / "ABC" / n) for n in ("k.cubin", "k.json")}
    assert triton_prebuild.entries(tmp_path / "new") == 1


def test_without_a_prebuilt_cache_the_check_says_it_compiles_cold(tmp_path):
    env = cache_step.install(tmp_path / "missing", tmp_path / "cache")
    assert "compile cold" in env["triton_cache"] and "TRITON_CACHE_DIR" not in os.environ
    assert cache_step.compiled_here(env, tmp_path / "cache") == env["triton_cache"]
    assert "none at" in cache_step.dry_run_line(tmp_path / "missing")


def test_a_cache_for_another_triton_is_not_installed(tmp_path, monkeypatch):
    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir()
    record = dict(triton="0.0", triton_key="another", python="3.12", target=90, configurations=0)
    (prebuilt / triton_prebuild.RECORD).write_text(json.dumps(record))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    env = cache_step.install(prebuilt, tmp_path / "cache")
    assert env["triton_cache"].startswith("not used (prebuilt for 0 configurations for sm_90, triton 0.0")
    assert "TRITON_CACHE_DIR" not in os.environ


AUTOTUNE_PLAN = """
import json, sys
from tools.gpu_check import autotune_step, triton_cache

class Unlimited:  # every configuration fits: what is planned, not compiled
    def shared_bytes(self, kernel, args, meta):
        return 0

    def save(self):
        pass

deit = [s for s in autotune_step.SHAPES if s[:3] == (197, 32, 6)]
log = triton_cache.autotune_launches(Unlimited(), deit)
rows = sorted({(x.kernel, x.meta["num_warps"], x.meta.get("BLOCK_N"), x.meta.get("SERIAL_TAPS")) for x in log}, key=str)
json.dump([list(r) for r in rows], open(sys.argv[1], "w"))
"""


def test_the_autotune_steps_candidates_are_planned_with_their_parameters(tmp_path):
    from tools.gpu_check import autotune_step

    out = tmp_path / "plan.json"
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))
    cmd = [sys.executable, "-c", AUTOTUNE_PLAN, str(out)]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = {tuple(r) for r in json.loads(out.read_text())}
    kernel = {"resident": "inline_{}_resident", "stream": "inline_{}_stream", "fused": "inline_{}_fused"}
    for direction, backward in (("fwd", False), ("bwd", True)):
        for choice in autotune_step.candidates(197, 32, backward):
            launch = (kernel[choice.design].format(direction), choice.num_warps, choice.block_n, choice.serial_taps)
            assert launch in planned, choice
    # the resident forward both ways (its rule's, serial at this 256 x 32 tile, is the default beside them)
    assert {("inline_fwd_resident", 8, None, True), ("inline_fwd_resident", 8, None, False)} <= planned


def test_the_dry_run_says_when_the_cache_lacks_the_autotune_candidates(tmp_path):
    record = dict(triton="3.6.0", triton_key="k", python="3.12", target=90, configurations=48, autotune=False)
    (tmp_path / triton_prebuild.RECORD).write_text(json.dumps(record))
    assert "without the autotune step's candidates" in cache_step.dry_run_line(tmp_path, autotune=True)
    assert "autotune" not in cache_step.dry_run_line(tmp_path, autotune=False)
    (tmp_path / triton_prebuild.RECORD).write_text(json.dumps({**record, "autotune": True}))
    line = cache_step.dry_run_line(tmp_path, autotune=True)
    assert "with the autotune step's candidates" in line and "without" not in line
