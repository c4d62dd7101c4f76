"""``inline-attn reproduce ablations``: the paper's ablations and comparisons, several seeds each.

Parts (one table each in the report, ``OUTPUT/report.md``):

- a. feature map phi x {linear, InLine}: the injectivity ablation (paper Table 1); InLine without its local
  residual so only the attention function differs;
- b. window x {with, without the local residual} (paper Table 4's local-modelling ablation);
- c. InLine's feature map (identity, ReLU, LeakyReLU, Exp), with the residual;
- d. the linear attentions side by side: params, MACs, train and inference img/s, top-1;
- e. masking the k x k neighbourhood vs as many random keys on the trained softmax, linear and
  InLine models of part d (paper Table 2);
- f. accuracy against inference time of every setting (paper Fig. 6a), a PNG;
- g. the four Fashion-MNIST variants of ``reproduce fmnist`` (configs/fmnist), several seeds.

Parts a-e train on the locality task of ``configs/ablations/_base.yaml`` (Fashion-MNIST at 56 px,
a 28 x 28 token grid). Every (setting, seed) is one training run in ``OUTPUT/<setting>/seed<s>``
(resumable mid-run through ``train.resume=auto``) and, once finished, one JSON in
``OUTPUT/results/``: a run whose JSON exists is skipped, so the command continues where it
stopped. The presets differ only in the budget (the GPU preset also in its batch and device,
:data:`GPU_OVERRIDES`); their outputs go to separate folders.
"""

from __future__ import annotations

import math
import os
import pathlib
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

import torch

from ..._io import atomic_write_text, read_json, save_figure
from ...layers import uses_local_residual
from ...models import PATTERN_KINDS
from ...runtime.output import claim_output
from ...runtime.report import markdown_table, write_json
from ...train.config import Config, configs_dir

ABLATION_CONFIG = "ablations/_base.yaml"
FEATURE_MAPS_A = ("identity", "relu", "leakyrelu", "exp", "affine_relu")
FEATURE_MAPS_C = ("identity", "relu", "leakyrelu", "exp")
WINDOWS = (7, 14, 28)
COMPARED = (
    "inline",
    "softmax",
    "linear",
    "hydra",
    "efficient",
    "angular",
    "relu_msa",
    "focused",
    "agent",
    "polarity",
    "mlla",
)  # InLine trains first
MASKED = ("softmax", "linear", "inline")
FMNIST_VARIANTS = ("softmax", "linear", "inline_nolr", "inline")
PARTS = "abcdefg"
# what shows that an output folder holds ablation runs: their results, the log of earlier
# invocations, a run stopped part-way (``<setting>/seed<N>/last.pth``)
ABLATION_RUN_FILES = ("results/*.json", "invocations.json", "*/seed*/last.pth")
PLAN_ORDER = "deabcgf"  # training order: the comparison (and the masked models) first
LETTER = {kind: letter for letter, kind in PATTERN_KINDS.items()}  # attention kind -> pattern letter
NAMES = {
    "inline": "InLine",
    "linear": "linear",
    "softmax": "softmax (Swin windows of 7)",
    "hydra": "Hydra",
    "efficient": "Efficient attention",
    "angular": "linear-angular (Castling-ViT)",
    "relu_msa": "ReLU multi-scale (EfficientViT)",
    "focused": "focused (FLatten)",
    "agent": "Agent attention",
    "polarity": "polarity-aware (PolaFormer)",
    "mlla": "MLLA's linear attention",
}
REPORT = "report.md"  # the report, in the output folder (its figure in figures/ beside it)


@dataclass(frozen=True)
class Budget:
    """What one run of a preset costs: training images per epoch, epochs, evaluation images."""

    subset: int  # training images per epoch of the locality task (0: all 60,000)
    val_subset: int  # test images scored (0: all 10,000)
    epochs: int
    fmnist_epochs: int  # part g (0: the configs' own)
    fmnist_subset: int  # part g training images (0: all)
    mask_images: int  # part e test images
    bench_batch: int  # inference img/s: batch and timed iterations
    bench_iters: int
    overrides: tuple = ()  # further config overrides of every run: (key, value) pairs

    def describe(self) -> str:
        """The budget in words, for the report and its verdicts."""
        extra = "".join(f", {k}={v}" for k, v in self.overrides)
        return f"{self.epochs} epoch(s) of {self.subset or 60000} training images per run{extra}"


# The GPU preset: every run 2 epochs of all 60,000 training images (10x the full preset's 12,000
# images), batch 256 (the recipe scales the learning rate with the batch: base_lr x 256 / 512) on
# CUDA. Sized from a measured CPU step (docs/reproduction.md, "The GPU preset"): parts a, b and d
# with 3 seeds are 72 runs of 469 steps, an estimated ~20 min on one H100, not a measurement.
# Fashion-MNIST stays uint8 in host memory; each batch (256 x 784 bytes) is copied pinned and
# non-blocking, and the resize, flip and normalisation run on the device.
GPU_OVERRIDES = (("data.batch_size", 256), ("train.device", "cuda"), ("data.on_device", True))
PRESETS = {
    "full": Budget(12000, 0, 1, 0, 0, 1000, 128, 10),
    "quick": Budget(1024, 500, 1, 1, 2048, 100, 32, 3),
    "gpu": Budget(0, 0, 2, 0, 0, 1000, 128, 10, overrides=GPU_OVERRIDES),
}


@dataclass(frozen=True)
class Setting:
    """One model and recipe, trained once per seed."""

    key: str
    label: str
    kind: str
    config: str
    overrides: tuple = field(default_factory=tuple)


def swin_setting(
    kind: str, feature_map: Optional[str] = None, window: int = 28, residual: Optional[bool] = None
) -> Setting:
    """A setting of the locality task; equal settings of different parts share one key (and runs).
    Its overrides are ``model.kwargs.{pattern, feature_map, window_size, local_residual}``."""
    if kind == "inline":
        feature_map = feature_map or "identity"
    elif kind == "linear":
        feature_map = feature_map or "relu"
    res = uses_local_residual(kind, residual)
    key = f"{kind}{'-' + feature_map if feature_map else ''}-w{window}{'-res' if res else ''}"
    label = NAMES[kind] + (f", {feature_map}" if feature_map else "")
    label += f", window {window}" if kind != "softmax" else ""
    label += ", residual" if res and kind != "inline" else (", no residual" if kind == "inline" and not res else "")
    ov = (
        ("model.kwargs.pattern", LETTER[kind] * 3),
        ("model.kwargs.feature_map", feature_map),
        ("model.kwargs.window_size", window),
        ("model.kwargs.local_residual", res),
    )
    return Setting(key, label, kind, ABLATION_CONFIG, ov)


def part_settings(part: str) -> list[Setting]:
    """The settings part ``part`` (a letter of :data:`PARTS`) trains or reads."""
    if part == "a":
        return [swin_setting(k, kern, residual=False) for kern in FEATURE_MAPS_A for k in ("linear", "inline")]
    if part == "b":
        return [swin_setting("inline", window=w, residual=r) for w in WINDOWS for r in (False, True)]
    if part == "c":
        return [swin_setting("inline", kern) for kern in FEATURE_MAPS_C]
    if part in "def":
        kinds = MASKED if part == "e" else COMPARED
        if part == "f":
            return unique(s for p in "abcd" for s in part_settings(p))
        return [swin_setting(k) for k in kinds]
    if part == "g":
        fm = "fmnist/{}.yaml"
        return [Setting(f"fmnist-{v}", f"fmnist {v}", v, fm.format(v)) for v in FMNIST_VARIANTS]
    raise ValueError(f"unknown part {part!r}: expected letters of {PARTS!r}")


def unique(settings) -> list[Setting]:
    seen, out = set(), []
    for s in settings:
        if s.key not in seen:
            seen.add(s.key)
            out.append(s)
    return out


def check_parts(parts: str) -> str:
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ValueError(f"parts {parts!r}: expected letters of {PARTS!r}")
    return parts


def plan(parts: str, seeds: Sequence[int]) -> list[tuple[Setting, int]]:
    """Every (setting, seed) the parts need, settings shared between parts trained once. Part by
    part in the order of :data:`PLAN_ORDER` (the comparison first), every seed of a setting before
    the next setting, so a partial run has whole parts with all their seeds."""
    check_parts(parts)
    ordered = [p for p in PLAN_ORDER if p in parts]
    settings = unique(s for p in ordered for s in part_settings(p))
    return [(s, seed) for s in settings for seed in seeds]


def _budget_overrides(setting: Setting, budget: Budget) -> list[tuple]:
    if setting.config == ABLATION_CONFIG:
        ov = [("data.subset", budget.subset), ("data.val_subset", budget.val_subset), ("sched.epochs", budget.epochs)]
        return ov + list(budget.overrides)
    ov = [("data.subset", budget.fmnist_subset), ("data.val_subset", budget.val_subset)]
    return ov + ([("sched.epochs", budget.fmnist_epochs)] if budget.fmnist_epochs else []) + list(budget.overrides)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_one(
    setting: Setting, seed: int, budget: Budget, output: pathlib.Path, config_dir: pathlib.Path
) -> Optional[dict]:
    """Train (or finish) one run and return its record; the trainer's summary (``stopped`` set)
    when a signal stopped it."""
    from ...train.task import train

    run_dir = output / setting.key / f"seed{seed}"
    ov = list(setting.overrides) + _budget_overrides(setting, budget)
    ov += [("train.seed", seed), ("train.output", str(run_dir)), ("train.resume", "auto")]
    cfg = Config.load(config_dir / setting.config, ov)
    load_before = _load()
    base = {"setting": setting.key, "label": setting.label, "kind": setting.kind, "seed": seed}
    try:
        summary = train(cfg)
    except FloatingPointError as e:  # a diverged run is a result (e.g. linear attention, identity kernel)
        return {**base, "top1": None, "diverged": str(e), "budget": asdict(budget), "load_before": load_before}
    if summary.get("stopped"):
        return summary
    summary = read_json(run_dir / "summary.json")
    return {
        **base,
        "top1": summary["final"]["val_top1"],
        "params": summary["params"],
        "macs": summary.get("macs"),
        "train_img_s": summary["train_img_s"],
        "train_time_s": summary.get("train_time_s"),
        "epochs": summary["epochs_done"],
        "budget": asdict(budget),
        "overrides": [list(o) for o in ov],
        "load_before": load_before,
        "load_after": _load(),
        "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def mask_one(setting: Setting, seed: int, budget: Budget, output: pathlib.Path) -> dict:
    """Part e on one trained run: top-1 unmasked, local k x k masked, as many random keys masked."""
    from ...analysis.common import ImageBatches, load_images, load_model
    from ...analysis.masking import masked_accuracy

    lm = load_model(None, output / setting.key / f"seed{seed}")
    images = load_images("fmnist", num_images=budget.mask_images)
    rows = masked_accuracy(lm.model, ImageBatches(images, lm, 50), ks=(3, 5, 7), seed=seed, progress=False)
    return {"setting": setting.key, "kind": setting.kind, "seed": seed, "rows": rows, "load": _load()}


def run_finished(run_dir: pathlib.Path) -> bool:
    """True when ``run_dir`` holds a run the trainer finished: its ``summary.json``, not stopped,
    and a checkpoint beside it."""
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return False
    try:
        if read_json(summary).get("stopped"):
            return False
    except (ValueError, AttributeError):  # not valid JSON (read_json), or not an object
        return False
    return any(run_dir.glob("*.pth"))


def preset_of(output: pathlib.Path) -> str:
    """The preset a run folder was trained with: from its result JSONs' budget, else the folder's
    name (``runs/ablations/<preset>``), else "full"."""
    for path in sorted((output / "results").glob("*__seed*.json")):
        try:
            b = read_json(path).get("budget") or {}
        except (ValueError, AttributeError):  # not valid JSON (read_json), or not an object
            continue
        for name, p in PRESETS.items():
            if (b.get("subset"), b.get("epochs")) == (p.subset, p.epochs):
                return name
    return output.name if output.name in PRESETS else "full"


def part_d_runs(output, kinds: Optional[Sequence[str]] = None, seed: int = 0) -> dict[str, pathlib.Path]:
    """{kind: trained run folder} of part d's setting of each kind (default: all of :data:`COMPARED`)
    in an ablation output folder (``reproduce ablations --output``), seed ``seed``.

    A ``ValueError`` names the kinds without a finished run there and the command that trains them.
    """
    kinds = list(kinds) if kinds else list(COMPARED)
    unknown = [k for k in kinds if k not in COMPARED]
    if unknown:
        raise ValueError(f"unknown attention kind(s) {unknown}: part d trains {list(COMPARED)}")
    out = pathlib.Path(output)
    if not out.is_dir():
        raise ValueError(f"--runs {str(out)!r} is not a folder (expected the --output of reproduce ablations)")
    runs = {k: out / swin_setting(k).key / f"seed{seed}" for k in kinds}
    missing = [k for k, d in runs.items() if not run_finished(d)]
    if missing:
        preset = preset_of(out)
        flag = {"full": "", "quick": " --quick"}.get(preset, f" --preset {preset}")
        cmd = f"inline-attn reproduce ablations{flag} --parts d --seeds {seed + 1} --output {out}"
        where = ", ".join(str(runs[k].relative_to(out)) for k in missing)
        raise ValueError(
            f"no finished part-d run of seed {seed} for kind(s) {missing} in {out} (looked for {where}: "
            f"summary.json and a checkpoint); train them with `{cmd}`"
        )
    return runs


def bench_one(setting: Setting, budget: Budget, config_dir: pathlib.Path) -> dict:
    """Inference img/s of the setting's model (random weights: speed does not depend on them), one thread."""
    from ...models import create_model
    from ...train.evaluate import inference_throughput

    cfg = Config.load(config_dir / setting.config, list(setting.overrides))
    img = cfg.data.img_size or 28
    model = create_model(cfg.model.name, num_classes=10, in_chans=1, **{"img_size": img, **cfg.model.kwargs})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ips = inference_throughput(model, (1, img, img), batch_size=budget.bench_batch, iters=budget.bench_iters)
    finally:
        torch.set_num_threads(threads)
    return {"setting": setting.key, "infer_img_s": round(ips, 1), "load": _load()}


def _cached(path: pathlib.Path, make: Callable[[], Optional[dict]]) -> tuple[Optional[dict], bool]:
    """(record, made_now): the JSON at ``path`` if it exists, else ``make()`` written atomically."""
    if path.is_file():
        return read_json(path), False
    rec = make()
    if rec is not None:
        write_json(rec, path)
    return rec, True


def _train_missing(todo, budget: Budget, out: pathlib.Path, cdir: pathlib.Path, max_runs: int, progress: bool):
    """Train the runs of ``todo`` without a result in ``out/results`` (at most ``max_runs``, 0: all);
    returns (trained now, found finished, the summary of the run a signal stopped, else None)."""
    from tqdm import tqdm

    trained = skipped = 0
    bar = tqdm(todo, desc="ablation runs", unit="run", disable=not progress)
    for setting, seed in bar:
        path = out / "results" / f"{setting.key}__seed{seed}.json"
        if path.is_file():
            skipped += 1
            continue
        if max_runs and trained >= max_runs:
            continue
        bar.set_postfix_str(f"{setting.key} seed {seed}")
        rec = run_one(setting, seed, budget, out, cdir)
        if rec.get("stopped"):
            return trained, skipped, rec
        write_json(rec, path)
        trained += 1
    return trained, skipped, None


def run_ablations(
    preset: str = "full",
    *,
    output: Optional[str] = None,
    parts: str = PARTS,
    seeds: int = 3,
    max_runs: int = 0,
    config_dir: Optional[str] = None,
    budget: Optional[Budget] = None,
    progress: bool = True,
    report_only: bool = False,
    resume: Optional[str] = None,
    overwrite: bool = False,
) -> dict:
    """Train what is missing, then tabulate whatever is finished into ``output/report.md`` (part f's
    figure into ``output/figures/``).

    Args:
        preset: "full", "quick" or "gpu" (:data:`PRESETS`); ``budget`` replaces its budget (tests).
        output: run folder (default ``runs/ablations/<preset>``).
        parts: letters of :data:`PARTS`.
        seeds: seeds 0 .. seeds-1 per setting (>= 3 for the mean +- std the tables report).
        max_runs: stop after training this many runs (0: no limit); the rest stays for later.
        report_only: train nothing; measure and tabulate the finished runs.
        resume: "auto" continues the runs in ``output``: a folder holding finished or stopped runs
            is refused without it (or ``overwrite``, which moves them into a subfolder), as
            :func:`~inline_attn.runtime.output.claim_output` refuses for every task.

    Returns {"trained": runs trained now, "skipped": runs found finished, "left": runs still to
    train, "stopped": True when a signal stopped a run, "signal": its number (else None), "report":
    the markdown}.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: expected one of {tuple(PRESETS)}")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if max_runs < 0:
        raise ValueError(f"max_runs must be >= 0 (0: no limit), got {max_runs}")
    budget = budget or PRESETS[preset]
    out = pathlib.Path(output or f"runs/ablations/{preset}")
    res_dir = out / "results"
    if report_only and overwrite:
        raise ValueError("--report-only tabulates the runs in --output: it cannot go with --overwrite (replacing them)")
    if report_only and not any(res_dir.glob("*.json")):
        # a mistyped --output would otherwise report "Runs finished: 0"
        raise ValueError(f"--report-only: no finished runs in {res_dir} (is --output the run folder?)")
    cdir = pathlib.Path(config_dir) if config_dir else configs_dir()
    t0 = time.time()
    todo = plan(parts, range(seeds))
    if report_only:
        done = [1 for s, sd in todo if (res_dir / f"{s.key}__seed{sd}.json").is_file()]
        trained, skipped, stopped = 0, len(done), None
    else:
        with claim_output(out, resume=resume, overwrite=overwrite, run_files=ABLATION_RUN_FILES):
            trained, skipped, stopped = _train_missing(todo, budget, out, cdir, max_runs, progress)
    left = sum(1 for s, sd in todo if not (res_dir / f"{s.key}__seed{sd}.json").is_file())
    results = _read(res_dir, todo)
    extras = {} if stopped else _extras(parts, results, budget, out, cdir, seeds, progress)
    wall = time.time() - t0
    if trained:
        log_invocation(out, t0, wall, trained)
    report = render(preset, parts, seeds, results, extras, budget, wall, left, max_runs, _invocations(out))
    atomic_write_text(out / REPORT, report)
    if "f" in parts and not stopped:
        plot_accuracy_vs_runtime(results, extras.get("bench", {}), out / "figures", preset)
    signal = stopped.get("signal") if stopped else None
    return {
        "trained": trained,
        "skipped": skipped,
        "left": left,
        "stopped": bool(stopped),
        "signal": signal,
        "report": report,
    }


def log_invocation(out: pathlib.Path, t0: float, wall: float, trained: int) -> None:
    """Append this invocation (start, wall time, runs trained, load) to ``out/invocations.json``."""
    rec = {
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0)),
        "wall_s": round(wall, 1),
        "runs_trained": trained,
        "load_at_end": _load(),
    }
    write_json({"invocations": _invocations(out) + [rec]}, out / "invocations.json")


def _invocations(out: pathlib.Path) -> list[dict]:
    path = out / "invocations.json"
    return read_json(path)["invocations"] if path.is_file() else []


def _read(res_dir: pathlib.Path, todo) -> dict[str, list[dict]]:
    """setting key -> its finished runs' records."""
    by: dict[str, list[dict]] = {}
    for s, seed in todo:
        p = res_dir / f"{s.key}__seed{seed}.json"
        if p.is_file():
            by.setdefault(s.key, []).append(read_json(p))
    return by


def _extras(parts, results, budget, out, cdir, seeds, progress) -> dict:
    """Masking (part e) on finished runs (cached, one JSON per run) and inference speed (parts d, f)."""
    from tqdm import tqdm

    res_dir = out / "results"
    extras: dict = {"mask": {}, "bench": {}}
    if "e" in parts:
        for s in part_settings("e"):
            for seed in range(seeds):
                if any(r["seed"] == seed and r["top1"] is not None for r in results.get(s.key, [])):
                    rec, _ = _cached(
                        res_dir / f"mask__{s.key}__seed{seed}.json", lambda: mask_one(s, seed, budget, out)
                    )
                    extras["mask"].setdefault(s.key, []).append(rec)
    if "d" in parts or "f" in parts:
        wanted = unique(s for p in parts if p in "abcdf" for s in part_settings(p))
        wanted = [s for s in wanted if s.key in results]
        # measured again by every invocation, all settings one after another, so the speeds compared
        # in one table come from one pass under one load
        for s in tqdm(wanted, desc="inference img/s", disable=not progress):
            extras["bench"][s.key] = bench_one(s, budget, cdir)
        write_json(extras["bench"], res_dir / "bench.json")
    return extras


# ---- statistics and verdicts


def mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return float("nan"), float("nan"), 0
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else float("nan")), len(v)


def fmt(values: Sequence[Optional[float]]) -> str:
    """ "mean ± std (n=...)" of the finite values; None values are diverged runs."""
    m, s, n = mean_std(values)
    diverged = sum(1 for v in values if v is None)
    if n == 0:
        return f"diverged ({diverged} of {diverged})" if diverged else "not run"
    cell = f"{m:.2f} ± {s:.2f} (n={n}" if n > 1 else f"{m:.2f} (n=1"
    return cell + (f"; {diverged} diverged)" if diverged else ")")


def _signed(d: float) -> str:
    """A difference in points, or "n/a" where a side has no runs yet."""
    return "n/a" if math.isnan(d) else f"{d:+.2f}"


def compare(a: Sequence[float], b: Sequence[float]) -> tuple[float, str]:
    """(mean a - mean b, "a" | "b" | "tie?" | "not run"): a side wins when the gap exceeds twice its standard
    error (Welch); fewer than two runs a side is never clear."""
    ma, sa, na = mean_std(a)
    mb, sb, nb = mean_std(b)
    if na == 0 or nb == 0:
        return float("nan"), "not run"
    if na < 2 or nb < 2:
        return ma - mb, "tie?"
    se = math.sqrt(sa**2 / na + sb**2 / nb)
    d = ma - mb
    return d, ("a" if d > 2 * se else "b" if -d > 2 * se else "tie?")


def verdict(outcomes: Sequence[str], claimed: str = "a") -> str:
    """agrees: every comparison clear in the claimed direction; differs: one clear against it."""
    outcomes = [o for o in outcomes if o != "not run"]  # a comparison without runs says nothing
    if not outcomes:
        return "not run"
    if any(o not in (claimed, "tie?") for o in outcomes):
        return "differs"
    return "agrees" if all(o == claimed for o in outcomes) else "inconclusive at this budget"


def tally(claim: str, outcomes: Sequence[str], better: str, worse: str) -> str:
    """A verdict line: ``claim: **verdict** (better A of N, worse B).``, A and B the comparisons
    clearly for ('a') and against ('b') the claim."""
    counts = f"{better} {outcomes.count('a')} of {len(outcomes)}, {worse} {outcomes.count('b')}"
    return f"{claim}: **{verdict(outcomes)}** ({counts})."


def top1s(results: dict, key: str) -> list[float]:
    return [r["top1"] for r in results.get(key, [])]


# ---- report


def render(preset, parts, seeds, results, extras, budget, wall, left, max_runs, invocations=()) -> str:
    flag = {"quick": " --quick", "full": ""}.get(preset, f" --preset {preset}")
    cmd = f"inline-attn reproduce ablations{flag} --seeds {seeds}"
    if parts != PARTS:
        cmd += f" --parts {parts}"
    runs = [r for rs in results.values() for r in rs]
    train_min = sum(r.get("train_time_s") or 0 for r in runs) / 60
    loads = [r["load_before"][0] for r in runs if r.get("load_before")]
    lines = [
        f"### The {preset} preset",
        "",
        f"Command: `{cmd}`. Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, one "
        f"torch thread per run. Runs finished: {len(runs)} ({train_min:.1f} min of training in all); still to run: "
        f"{left}. 1-minute load average when the runs started: "
        + (f"{min(loads):.1f}-{max(loads):.1f}" if loads else "n/a")
        + " (a shared machine). Wall time of the invocations that trained: "
        + (
            ", ".join(
                f"{i['wall_s'] / 60:.1f} min from {i['started_utc']} UTC ({i['runs_trained']} runs)"
                for i in invocations
            )
            or "none recorded"
        )
        + f"; this one {wall / 60:.1f} min.",
        f"Budget per run: {budget.epochs} epoch(s) over {budget.subset or 60000} training images of the locality "
        f"task (configs/ablations/_base.yaml), top-1 on {budget.val_subset or 10000} test images; seeds "
        f"0-{seeds - 1}. Cells: mean ± sample std over seeds (n = runs finished)."
        + (
            f" Further overrides of every run: {', '.join(f'{k}={v}' for k, v in budget.overrides)}."
            if budget.overrides
            else ""
        ),
        "",
    ]
    verdicts = []
    if "a" in parts:
        lines += table_a(results, verdicts)
    if "b" in parts:
        lines += table_b(results, verdicts)
    if "c" in parts:
        lines += table_c(results, verdicts)
    if "d" in parts:
        lines += table_d(results, extras.get("bench", {}), verdicts)
    if "e" in parts:
        lines += table_e(extras.get("mask", {}), verdicts)
    if "f" in parts:
        lines += [
            "#### f. Accuracy against inference time (cf. Fig. 6a)",
            "",
            f"![accuracy vs runtime](figures/ablations_{preset}_fig6a.png)",
            "",
        ]
    if "g" in parts:
        lines += table_g(results, verdicts)
    lines += [f"#### Verdicts at this budget ({budget.describe()})", ""] + [f"- {v}" for v in verdicts] + [""]
    return "\n".join(lines)


def table_a(results, verdicts):
    """The markdown lines of part a (feature map x {linear, InLine}); its verdicts appended to ``verdicts``."""
    rows, outcomes = [], []
    for kern in FEATURE_MAPS_A:
        a, b = swin_setting("inline", kern, residual=False).key, swin_setting("linear", kern, residual=False).key
        d, o = compare(top1s(results, a), top1s(results, b))
        outcomes.append(o)
        rows.append([kern, fmt(top1s(results, b)), fmt(top1s(results, a)), _signed(d)])
    verdicts.append(
        tally("InLine beats linear attention for every kernel (Table 1)", outcomes, "clear wins:", "clear losses:")
    )
    columns = ["kernel", "linear top-1 (%)", "InLine top-1 (%)", "InLine - linear"]
    title = "#### a. Kernel x {linear, InLine} (injectivity ablation, cf. Table 1; no local residual)"
    return [title, "", *markdown_table(rows, columns), ""]


def table_b(results, verdicts):
    """The markdown lines of part b (window x local residual); its verdicts appended to ``verdicts``."""
    rows, outcomes, gains = [], [], []
    for w in WINDOWS:
        on, off = (
            swin_setting("inline", window=w, residual=True).key,
            swin_setting("inline", window=w, residual=False).key,
        )
        d, o = compare(top1s(results, on), top1s(results, off))
        outcomes.append(o)
        gains.append(d)
        where = "global" if w >= 28 else f"{w} / {'global' if w >= 14 else w}"
        rows.append([f"{w} ({where})", fmt(top1s(results, off)), fmt(top1s(results, on)), _signed(d)])
    verdicts.append(
        f"The local residual helps InLine at every window size: **{verdict(outcomes)}** (gains "
        + ", ".join(_signed(g) for g in gains)
        + " points for windows "
        + ", ".join(map(str, WINDOWS))
        + ")."
    )

    def seed_gains(w):  # per-seed gain of the residual at window w (runs paired by seed)
        on = {r["seed"]: r["top1"] for r in results.get(swin_setting("inline", window=w, residual=True).key, [])}
        off = {r["seed"]: r["top1"] for r in results.get(swin_setting("inline", window=w, residual=False).key, [])}
        return [on[s] - off[s] for s in on if s in off and on[s] is not None and off[s] is not None]

    d, o = compare(seed_gains(WINDOWS[-1]), seed_gains(WINDOWS[0]))
    v = verdict([o])
    verdicts.append(
        f"The residual matters more for larger windows (the paper's reading of Table 4): **{v}** (per-seed gain "
        f"at window {WINDOWS[-1]} minus at window {WINDOWS[0]}: {_signed(d)} points)."
    )
    columns = ["window (stage 1 / 2)", "without residual", "with residual", "gain"]
    title = "#### b. Window size x local residual (InLine, identity kernel; cf. Table 4)"
    return [title, "", *markdown_table(rows, columns), ""]


def table_c(results, verdicts):
    """The markdown lines of part c (InLine's feature map); its verdicts appended to ``verdicts``."""
    rows = [[kern, fmt(top1s(results, swin_setting("inline", kern).key))] for kern in FEATURE_MAPS_C]
    lines = [
        "#### c. InLine's kernel (with the residual, global window)",
        "",
        *markdown_table(rows, ["kernel", "top-1 (%)"]),
    ]
    ident = top1s(results, swin_setting("inline", "identity").key)
    outcomes = [compare(ident, top1s(results, swin_setting("inline", k).key))[1] for k in FEATURE_MAPS_C[1:]]
    worse = outcomes.count("b")
    if all(o == "not run" for o in outcomes):
        v = "not run"
    else:
        v = "differs" if worse else ("agrees" if "a" in outcomes else "inconclusive at this budget")
    verdicts.append(
        f"InLine needs no non-linear kernel: identity (the published models' choice) is not beaten: **{v}** "
        f"(identity clearly better than {outcomes.count('a')} of 3 kernels, clearly worse than {worse})."
    )
    return lines + [""]


def table_d(results, bench, verdicts):
    """The markdown lines of part d (the linear attentions side by side); its verdicts appended to ``verdicts``."""
    inl = top1s(results, swin_setting("inline").key)
    rows, outcomes = [], []
    for kind in COMPARED:
        s = swin_setting(kind)
        rs = [r for r in results.get(s.key, []) if r.get("top1") is not None]
        if not rs:
            rows.append([NAMES[kind], "", "", "", "", "not run"])
            continue
        macs = f"{rs[0]['macs'] / 1e6:.1f}" if rs[0].get("macs") else "n/a"
        train_ips = statistics.median(r["train_img_s"] for r in rs)
        ips = bench.get(s.key, {}).get("infer_img_s")
        shown_ips = "n/a" if ips is None else f"{ips:.0f}"
        rows.append(
            [NAMES[kind], f"{rs[0]['params']:,}", macs, f"{train_ips:.0f}", shown_ips, fmt(top1s(results, s.key))]
        )
        if kind not in ("inline", "softmax"):
            outcomes.append(compare(inl, top1s(results, s.key))[1])
    columns = ["attention", "params", "MACs (M)", "train img/s", "inference img/s", "top-1 (%)"]
    lines = [
        "#### d. The linear attentions at one layout (global windows; softmax: Swin's windows of 7)",
        "",
        *markdown_table(rows, columns),
        "",
        "Train img/s: median over the runs (measured while training, so under the load noted above); "
        "inference img/s: one thread, random weights, all settings measured one after another.",
    ]
    verdicts.append(
        tally(
            "InLine beats the other linear attentions (Table 6)", outcomes, "clearly better than", "clearly worse than"
        )
    )
    return lines + [""]


def table_e(mask, verdicts):
    """The markdown lines of part e (the neighbourhood vs random keys masked); its verdicts appended to ``verdicts``."""
    rows, drops = [], {}
    for kind in MASKED:
        recs = mask.get(swin_setting(kind).key, [])
        if not recs:
            rows.append([NAMES[kind], "not run"] + [""] * 6)
            continue

        def cell(m, k, recs=recs):
            return [next(r["top1"] for r in rec["rows"] if r["mask"] == m and r["k"] == k) for rec in recs]

        cells = [fmt(cell("none", 0))] + [fmt(cell(m, k)) for k in (3, 5, 7) for m in ("local", "random")]
        rows.append([NAMES[kind], *cells])
        drops[kind] = [rnd - loc for rnd, loc in zip(cell("random", 7), cell("local", 7))]  # extra loss from locality
    n_img = "?"
    for recs in mask.values():
        n_img = recs[0]["rows"][0]["images"]
        break
    columns = ["attention", "unmasked"] + [f"{m} {k}x{k}" for k in (3, 5, 7) for m in ("local", "random")]
    lines = [
        "#### e. Masking each query's k x k neighbourhood vs as many random keys (cf. Table 2)",
        "",
        *markdown_table(rows, columns),
        "",
        f"Top-1 on the first {n_img} test images; the local residual of InLine stays on.",
        "",
    ]
    if "softmax" in drops and "linear" in drops:
        d, o = compare(drops["softmax"], drops["linear"])
        v = verdict([o])
        verdicts.append(
            f"Softmax attention depends more on local keys than linear attention (Table 2): **{v}** (the 7x7 "
            f"local mask costs softmax {statistics.fmean(drops['softmax']):.2f} points more than random keys, "
            f"linear {statistics.fmean(drops['linear']):.2f})."
        )
    return lines


def table_g(results, verdicts):
    """The markdown lines of part g (the four Fashion-MNIST variants); its verdicts appended to ``verdicts``."""
    rows = [[v, fmt(top1s(results, f"fmnist-{v}"))] for v in FMNIST_VARIANTS]
    lines = [
        "#### g. The four Fashion-MNIST variants (configs/fmnist, DeiT on the 7 x 7 grid), several seeds",
        "",
        *markdown_table(rows, ["variant", "top-1 (%)"]),
    ]
    inl = top1s(results, "fmnist-inline")
    outcomes = [compare(inl, top1s(results, f"fmnist-{v}"))[1] for v in FMNIST_VARIANTS[:-1]]
    claim = "On the 7 x 7 Fashion-MNIST task InLine beats softmax, linear and InLine without residual"
    verdicts.append(tally(claim, outcomes, "clear wins:", "clear losses:"))
    return lines + [""]


def plot_accuracy_vs_runtime(results: dict, bench: dict, folder: pathlib.Path, preset: str) -> Optional[str]:
    """Top-1 (mean ± std over seeds) against inference ms per image, one point per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = []
    for key, rs in results.items():
        ips = bench.get(key, {}).get("infer_img_s")
        if ips and not key.startswith("fmnist-"):
            m, s, _ = mean_std([r["top1"] for r in rs])
            if math.isnan(m):  # every seed diverged
                continue
            pts.append((1000.0 / ips, m, 0.0 if math.isnan(s) else s, rs[0]["kind"], rs[0]["label"]))
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    kinds = sorted({p[3] for p in pts})
    colours, markers = plt.get_cmap("tab20"), "os^Dv<>P"  # eleven kinds: more than the default 10 colours
    for ci, kind in enumerate(kinds):
        sel = [p for p in pts if p[3] == kind]
        ax.errorbar([p[0] for p in sel], [p[1] for p in sel], yerr=[p[2] for p in sel], fmt=markers[ci % len(markers)],
                    color=colours(ci % 20), label=NAMES[kind], capsize=3)  # fmt: skip
    ax.set_xlabel("inference time (ms per image, one thread)")
    ax.set_ylabel("top-1 (%)")
    ax.set_title("Accuracy vs runtime of every setting (cf. paper Fig. 6a)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ablations_{preset}_fig6a.png"
    save_figure(fig, path)
    plt.close(fig)
    return str(path)
