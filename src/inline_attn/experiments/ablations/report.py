"""The ablations' report: one markdown table per part and the verdicts at the run's budget."""

from __future__ import annotations

import math
import os
import platform
import statistics

import torch

from ...runtime.report import markdown_table
from ...train.config import FMNIST_VARIANTS
from .settings import (
    COMPARED,
    FEATURE_MAPS_A,
    FEATURE_MAPS_C,
    MASKED,
    NAMES,
    PARTS,
    WINDOWS,
    swin_setting,
)
from .verdicts import compare, fmt, tally, top1s, verdict


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


def _signed(d: float) -> str:
    """A difference in points, or "n/a" where a side has no runs yet."""
    return "n/a" if math.isnan(d) else f"{d:+.2f}"


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
        "Train img/s: median over the runs, measured while training (on the machine and under the load "
        "the section's header names); inference img/s: one thread, random weights, all settings measured "
        "one after another (n/a where this preset does not measure it).",
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
