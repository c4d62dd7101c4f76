"""The benchmark and kernel-build commands refuse flags they cannot honour before any work, naming the
flag: counts below their range, output names that leave the output folder, devices the benchmarks do not
run on, model specs that name no model or argument, and bench residual's dtype, device and amp (it
measures eager float32 on the CPU and used to ignore them)."""

from __future__ import annotations

import json

import pytest

from inline_attn.cli import main

QUICK = ["--repeats", "1", "--warmup", "0", "--no-memory", "--no-plot"]
TINY_ATTENTION = ["--sizes", "3", "--dim", "12", "--heads", "3", "--kinds", "inline"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["attention", "--batch", "-2"], "--batch -2: expected an integer >= 1"),
        (["attention", "--batch", "0"], "--batch 0: expected an integer >= 1"),
        (["attention", "--tokens", "0"], "--tokens 0: expected an integer >= 1"),
        (["attention", "--threads", "0"], "--threads 0: expected an integer >= 1"),
        (["attention", "--name", "../../escaped"], "--name '../../escaped': expected a file name without folders"),
        (["attention", "--name", "sub/x"], "--name 'sub/x': expected a file name without folders"),
        (["attention", "--name", ".."], "--name '..': expected a file name without folders"),
        (["attention", "--device", "mps"], "--device 'mps': the benchmarks run on cpu or cuda"),
        (["attention", "--device", "bogus"], "--device 'bogus': expected cpu, cuda or cuda:N"),
        (["model", "--models", "bogus"], "model spec 'bogus': unknown model 'bogus'"),
        (
            ["model", "--models", "A=inline_deit_tiny:bogus=1"],
            "model spec 'A=inline_deit_tiny:bogus=1': model 'inline_deit_tiny' takes no argument 'bogus'",
        ),
        (
            ["model", "--models", "A=inline_deit_tiny:qkv_bias=no"],
            "create_model('inline_deit_tiny', qkv_bias='no'): expected true or false",
        ),
        (["model", "--models", "inline_deit_tiny", "--resolutions", "0"], "--resolutions 0: expected an integer >= 1"),
        (["model", "--models", "inline_deit_tiny", "--name", "../x"], "--name '../x': expected a file name"),
        (
            ["residual", "--dtype", "bfloat16"],
            "--dtype 'bfloat16': bench residual measures eager float32 on the CPU only",
        ),
        (["residual", "--amp", "bf16"], "--amp 'bf16': bench residual measures eager float32 on the CPU only"),
        (["residual", "--device", "cuda"], "--device 'cuda': bench residual measures eager float32 on the CPU only"),
        (["residual", "--cuda-graphs"], "--cuda-graphs True: bench residual measures eager float32 on the CPU only"),
        (["residual", "--name", "../r"], "--name '../r': expected a file name"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_a_flag_the_benchmark_cannot_honour_is_refused_before_the_work(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    extra = TINY_ATTENTION if argv[0] == "attention" else []
    assert main(["bench", *argv, *QUICK, *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # nothing written, inside --out or beside it


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--sizes", "-7"], "grid sizes must be positive, got -7"),
        (["--sizes", "0"], "grid sizes must be positive, got 0"),
        (["--budget", "-1"], "--budget '-1': expected a finite number of seconds > 0"),
        (["--budget", "inf"], "--budget 'inf': expected a finite number of seconds > 0"),
        (["--budget", "soon"], "--budget 'soon': expected a finite number of seconds > 0"),
        (["--repeats", "0"], "--repeats 0: expected an integer >= 1"),
        (["--warmup", "-1"], "--warmup -1: expected an integer >= 0"),
    ],
)
@pytest.mark.parametrize("quick", [[], ["--quick"]], ids=["", "quick"])
def test_sweep_flags_are_checked_with_or_without_quick(tmp_path, capsys, flags, message, quick):
    """--quick fills only the flags not given: a bad one given beside it is refused like any other
    (it used to be replaced by the preset without a word)."""
    argv = ["bench", "attention", *quick, "--dim", "12", "--heads", "3", "--kinds", "inline", "--no-plot", *flags]
    try:
        rc = main([*argv, "--out", str(tmp_path / "out")])
    except SystemExit as e:  # a value argparse's type refuses
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_values_given_win_over_quick(tmp_path, capsys):
    argv = ["bench", "attention", "--quick", "--sizes", "3", "--repeats", "1", "--budget", "0.5", "--no-plot"]
    assert main([*argv, "--dim", "12", "--heads", "3", "--kinds", "inline", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "attention.json").read_text())
    assert {r["side"] for r in result["rows"]} == {3}
    assert result["meta"]["repeats"] == 1 and result["meta"]["budget_s"] == 0.5


def test_the_neighbours_run(tmp_path, capsys):
    argv = ["bench", "attention", *QUICK, *TINY_ATTENTION, "--batch", "1", "--threads", "1", "--name", "ok"]
    assert main(argv + ["--out", str(tmp_path)]) == 0
    assert (tmp_path / "ok.json").is_file()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lock-timeout", "-1"], "lock_timeout=-1.0: expected a finite number of seconds >= 0"),
        (["--lock-timeout", "nan"], "lock_timeout=nan: expected a finite number of seconds >= 0"),
        (["--lock-timeout", "inf"], "lock_timeout=inf: expected a finite number of seconds >= 0"),
        (["--cache", "{file}"], "the kernel cache {file} is a file: expected a folder"),
    ],
)
def test_build_kernel_refuses_a_bad_wait_or_cache(tmp_path, capsys, monkeypatch, argv, message):
    file = tmp_path / "a-file"
    file.write_text("x")
    monkeypatch.setenv("INLINE_ATTN_KERNEL_CACHE", str(tmp_path / "cache"))  # never the user's cache
    assert main(["build-kernel", *[a.format(file=file) for a in argv]]) == 2
    assert message.format(file=file) in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()
