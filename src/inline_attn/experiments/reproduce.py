"""``inline-attn reproduce fmnist``: the four attention variants of one small DeiT on Fashion-MNIST,
trained with the same budget, tabulated (accuracy, parameters, MACs, images/s) into a markdown file."""

from __future__ import annotations

import pathlib
import platform
import time
from typing import Callable, Optional, Sequence

import torch

from .._io import read_json
from ..runtime.config import check_distinct
from ..runtime.report import markdown_table
from ..train.config import configs_dir, Config
from .doc_section import check_doc, replace_section, table_rows

# the columns of the Fashion-MNIST table
COLUMNS = [
    "variant",
    "top-1 (%)",
    "top-5 (%)",
    "params",
    "MACs (M)",
    "train img/s",
    "inference img/s",
    "train time (min)",
]
LABELS = {
    "softmax": "Softmax attention (pattern S)",
    "linear": "Linear attention, ReLU kernel (pattern L)",
    "inline_nolr": "InLine without local residual",
    "inline": "InLine (with local residual)",
}
BEGIN, END = "<!-- fmnist-table:begin -->", "<!-- fmnist-table:end -->"


def reproduce_fmnist(
    output: str = "runs/fmnist",
    epochs: Optional[int] = None,
    doc: Optional[str] = None,
    variants: Sequence[str] = tuple(LABELS),
    config_dir: Optional[str] = None,
    replace_fewer: bool = False,
) -> tuple[list[dict], Optional[dict]]:
    """Train (or resume) each variant, then tabulate; returns (table rows, the summary of the run
    a signal stopped, else None). Running it again continues where it stopped.

    ``doc``: a markdown file to write the table into (its section: :func:`write_section`, with
    ``replace_fewer``), checked before any training; None writes none."""
    from ..train.task import train
    from ..train.evaluate import inference_throughput, load_trained_model

    check_distinct("variants", variants)
    doc_path = check_doc(doc, replace_fewer)
    cdir = pathlib.Path(config_dir) if config_dir else configs_dir()
    rows = []
    t_all = time.time()
    for v in variants:
        cfg_path = cdir / "fmnist" / f"{v}.yaml"
        overrides = [("train.output", str(pathlib.Path(output) / v)), ("train.resume", "auto")]
        if epochs:
            overrides.append(("sched.epochs", int(epochs)))
        cfg = Config.load(cfg_path, overrides)
        print(f"reproduce fmnist: {v} ({cfg_path})", flush=True)
        summary = train(cfg)
        if summary.get("stopped"):
            return rows, summary
        out = pathlib.Path(summary["output"])
        summary = read_json(out / "summary.json")
        net, _ = load_trained_model(out / "last.pth")
        threads = torch.get_num_threads()
        torch.set_num_threads(cfg.train.threads or threads)  # the threads it trained with
        try:
            ips = inference_throughput(net, (1, 28, 28), batch_size=256)
        finally:
            torch.set_num_threads(threads)
        rows.append(
            {
                "variant": v,
                "label": LABELS[v],
                "top1": summary["final"]["val_top1"],
                "top5": summary["final"]["val_top5"],
                "params": summary["params"],
                "macs": summary.get("macs"),
                "train_img_s": summary["train_img_s"],
                "infer_img_s": round(ips, 1),
                "train_time_s": summary.get("train_time_s"),
                "epochs": summary["epochs_done"],
                "output": str(out),
            }
        )
    total = time.time() - t_all
    table = render_table(rows, total, epochs)
    print(table)
    if doc_path:
        write_section(doc_path, table, replace_fewer=replace_fewer)
        print(f"table written to {doc_path}")
    return rows, None


def render_table(rows: list[dict], total_s: float, epochs: Optional[int]) -> str:
    cmd = "inline-attn reproduce fmnist" + (f" --epochs {epochs}" if epochs else "")
    lines = [
        "## Fashion-MNIST: the four attention variants",
        "",
        f"Command: `{cmd}` (configs in `configs/fmnist/`; same model, recipe and epoch budget for all four).",
        f"Measured on {platform.machine()} with the configs' torch threads, torch {torch.__version__}; "
        f"this command ran {total_s / 60:.1f} min; the last column is each variant's training time (accumulated "
        "across resumes, evaluation included). Timings depend on the machine's load: compare them within one table.",
        "Accuracy on the 10,000 test images after the last epoch. MACs: one 28 x 28 image "
        "(torch.utils.flop_counter, multiply-adds). Train img/s: median epoch throughput with augmentation; "
        "inference img/s: forward pass, batch 256.",
        "",
    ]
    cells = []
    for r in rows:
        macs = f"{r['macs'] / 1e6:.2f}" if r.get("macs") else "n/a"
        tt = f"{r['train_time_s'] / 60:.1f}" if r.get("train_time_s") else "n/a"
        cells.append(
            [r["label"], f"{r['top1']:.2f}", f"{r['top5']:.2f}", f"{r['params']:,}", macs]
            + [f"{r['train_img_s']:.0f}", f"{r['infer_img_s']:.0f}", tt]
        )
    lines += markdown_table(cells, COLUMNS)
    return "\n".join(lines) + "\n"


def fmnist_runs(section: str) -> int:
    """Finished runs a Fashion-MNIST section reports: its table's rows, one per variant."""
    return len(table_rows(section))


def write_section(
    path: pathlib.Path,
    table: str,
    begin: str = BEGIN,
    end: str = END,
    *,
    runs: Callable[[str], int] = fmnist_runs,
    replace_fewer: bool = False,
) -> None:
    """Replace the section of ``path`` between the markers ``begin`` and ``end`` (the Fashion-MNIST
    table's by default; appended when absent); other text stays. A section that reports more
    finished runs (``runs``) than ``table`` is kept, with a ValueError, unless ``replace_fewer``."""
    block = f"{begin}\n{table}{end}"
    replace_section(path, block, begin, end, runs=runs, replace_fewer=replace_fewer, new_file="# Reproduction\n\n")
