"""The lease preset's section of docs/reproduction.md: tables, verdicts beside the CPU presets', learning curves.

:func:`lease_section` tabulates parts a-d from the lease's run records (:mod:`.lease`) with the
tables of the CPU presets, then sets each claim's verdict beside the verdict the CPU presets'
sections of the same document give it, each with its budget, and says in one line where a claim
flips between budgets. :func:`plot_curves` draws the learning curves of parts a and d (top-1 on
the test images against training images seen, the mean over seeds) as one PNG.
"""

from __future__ import annotations

import pathlib
import re
from typing import Optional, Sequence

from tools.files import save_figure
from inline_attn.runtime.report import markdown_table
from inline_attn.experiments.ablations import (
    FEATURE_MAPS_A,
    NAMES,
    COMPARED,
    table_a,
    table_b,
    table_c,
    table_d,
    swin_setting,
)
from tools.update_docs import SECTIONS, replace_section
from .lease import LEASE, lease_plan, run_id

CPU_PRESETS = ("full", "quick")
FIGURE = "figures/ablations_lease_curves.png"
_VERDICT = re.compile(r"^- (?P<claim>.+?): \*\*(?P<verdict>[^*]+)\*\*")
_BUDGET = re.compile(r"^#### Verdicts at this budget \((?P<budget>.+)\)\s*$")


def preset_verdicts(doc_text: str, preset: str) -> tuple[Optional[str], dict[str, str]]:
    """(budget, {claim: verdict}) of ``preset``'s ablation section in ``doc_text`` ((None, {}) without one)."""
    begin, end = SECTIONS["ablations"].markers(preset)
    if begin not in doc_text or end not in doc_text:
        return None, {}
    section = doc_text[doc_text.index(begin) : doc_text.index(end)]
    budget, verdicts = None, {}
    for line in section.splitlines():
        m = _BUDGET.match(line)
        if m:
            budget = m.group("budget")
        m = _VERDICT.match(line)
        if m:
            verdicts[m.group("claim")] = m.group("verdict")
    return budget, verdicts


def by_setting(records: dict[str, dict], seeds: int) -> dict[str, list[dict]]:
    """setting key -> its finished runs' records, in the plan's order."""
    out: dict[str, list[dict]] = {}
    for _, s, seed in lease_plan(seeds):
        rec = records.get(run_id(s, seed))
        if rec is not None:
            out.setdefault(s.key, []).append(rec)
    return out


def compare_budgets(lease_lines: Sequence[str], doc_text: str) -> list[str]:
    """A table of each claim's verdict at every budget, and one line for each claim that flips."""
    ours = {m.group("claim"): m.group("verdict") for m in map(_VERDICT.match, lease_lines) if m}
    columns, cells, budgets = [], {}, []
    for preset in CPU_PRESETS:
        budget, verdicts = preset_verdicts(doc_text, preset)
        if budget is not None:
            columns.append(preset)
            budgets.append(f"{preset}: {budget}")
            cells[preset] = verdicts
    rows, flips = [], []
    for claim, verdict in ours.items():
        rows.append([claim] + [cells[p].get(claim, "not in that section") for p in columns] + [verdict])
        for p in columns:
            before = cells[p].get(claim)
            if p == "full" and before and before != verdict and "not run" not in (before, verdict):
                flips.append(
                    f"- **Flips**: {claim}: **{before}** at the full preset's budget, **{verdict}** at the lease's."
                )
    lines = ["#### The verdicts at each budget", ""]
    lines += [f"Budgets: {'; '.join(budgets + ['lease: ' + LEASE.describe()])}.", ""]
    lines += markdown_table(rows, ["claim", *[f"{p} preset" for p in columns], "lease preset"]) + [""]
    return lines + (flips or ["No claim flips between the full preset's budget and the lease's."]) + [""]


def _header(records: dict[str, dict], invocations: Sequence[dict], seeds: int) -> list[str]:
    runs = len(records)
    devices = sorted({i["device"] for i in invocations if i.get("runs_trained")}) or ["none recorded"]
    steps = sorted(r["step_ms"] for r in records.values() if r.get("step_ms"))
    graphed = sum(1 for r in records.values() if r.get("graphed"))
    walls = ", ".join(
        f"{i['wall_s'] / 60:.1f} min from {i['started_utc']} UTC on {i['device']} ({i['runs_trained']} runs)"
        for i in invocations
    )
    return [
        "### The lease preset",
        "",
        "Command: `make ablations-lease` on a GPU machine (`python -m tools.ablations_lease.lease`), "
        f"{seeds} seeds, parts a-d. Device: {', '.join(devices)}. Runs finished: {runs} of {len(lease_plan(seeds))} "
        f"({graphed} CUDA-graphed); invocations: {walls or 'none recorded'}. Step time (ms, batch "
        f"{dict(LEASE.overrides)['data.batch_size']}): "
        + (f"{steps[0]:.2f}-{steps[-1]:.2f}, median {steps[len(steps) // 2]:.2f}" if steps else "n/a")
        + ".",
        f"Budget per run: {LEASE.describe()}; top-1 on the 10,000 test images after the last step. Cells: mean ± "
        "sample std over seeds (n = runs finished). Inference img/s is measured by the CPU presets only.",
        "",
    ]


def lease_section(records: dict[str, dict], invocations: Sequence[dict], doc_text: str, seeds: int = 3) -> str:
    """The markdown of the lease preset's section (between its markers in the doc)."""
    results, verdicts = by_setting(records, seeds), []
    lines = _header(records, invocations, seeds)
    lines += table_a(results, verdicts) + table_b(results, verdicts) + table_c(results, verdicts)
    lines += table_d(results, {}, verdicts)
    lines += [f"#### Verdicts at this budget ({LEASE.describe()})", ""] + [f"- {v}" for v in verdicts] + [""]
    lines += compare_budgets([f"- {v}" for v in verdicts], doc_text)
    lines += ["#### Learning curves of parts a and d", "", f"![learning curves, parts a and d]({FIGURE})", ""]
    return "\n".join(lines)


def _mean_curve(recs: list[dict]) -> Optional[tuple[list[int], list[float]]]:
    """Images seen and the mean top-1 over the runs that reached each point."""
    curves = [r["curve"] for r in recs if r.get("curve") and r["curve"]["images"]]
    if not curves:
        return None
    longest = max(curves, key=lambda c: len(c["images"]))
    means = []
    for i in range(len(longest["images"])):
        vals = [c["val_top1"][i] for c in curves if len(c["val_top1"]) > i]
        means.append(sum(vals) / len(vals))
    return longest["images"], means


def plot_curves(records: dict[str, dict], path: pathlib.Path, seeds: int = 3) -> Optional[pathlib.Path]:
    """Parts a (kernel x {linear, InLine}) and d (the linear attentions): two panels of one PNG (None: no curves)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = by_setting(records, seeds)
    panels = {
        "a. kernel x {linear (dashed), InLine (solid)}, no residual": [
            (swin_setting(k, kern, residual=False), kern, "--" if k == "linear" else "-")
            for kern in FEATURE_MAPS_A
            for k in ("linear", "inline")
        ],
        "d. the linear attentions": [(swin_setting(k), NAMES[k], "-") for k in COMPARED],
    }
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=100)
    drawn = 0
    for ax, (title, series) in zip(axes, panels.items()):
        colours, seen = plt.get_cmap("tab10" if title.startswith("a.") else "tab20"), {}
        for setting, label, style in series:
            curve = _mean_curve(results.get(setting.key, []))
            if curve is None:
                continue
            colour = colours(seen.setdefault(label, len(seen)) % colours.N)
            kind = "" if style == "-" or "a." not in title else " (linear)"
            ax.plot([x / 1000 for x in curve[0]], curve[1], style, color=colour, marker=".", label=label + kind)
            drawn += 1
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training images seen (thousands)")
        ax.set_ylabel("top-1 (%), mean over seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if not drawn:
        plt.close(fig)
        return None
    fig.suptitle(f"Learning curves at the lease preset's budget ({LEASE.describe()})", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def write_lease_report(folders: Sequence, doc, *, seeds: int = 3, replace_fewer: bool = False) -> str:
    """The lease's records in ``folders`` (later ones win) into ``doc``'s lease section, its PNG in
    ``figures/`` beside ``doc``; returns the section. A ValueError when no folder holds a record
    (a mistyped folder must not blank a committed section)."""
    from tools.files import read_json
    from .lease import LOG, read_records

    folders = [pathlib.Path(f) for f in folders]
    records = read_records(folders)
    if not records:
        raise ValueError(f"no lease run records (lease-<n>-<parts>.json) in {', '.join(map(str, folders))}")
    invocations: list[dict] = []
    for folder in folders:
        if (folder / LOG).is_file():
            invocations += [e for e in read_json(folder / LOG)["invocations"] if e not in invocations]
    doc = pathlib.Path(doc)
    section = lease_section(records, invocations, doc.read_text() if doc.is_file() else "", seeds)
    replace_section(doc, section + "\n", "ablations", "lease", replace_fewer=replace_fewer)
    plot_curves(records, doc.parent / FIGURE, seeds)
    return section
