"""``inline-attn reproduce fmnist``: the four attention variants of one small DeiT on Fashion-MNIST,
trained with the same budget, tabulated (accuracy, parameters, MACs, images/s) into ``OUTPUT/report.md``."""

from __future__ import annotations

import pathlib
import platform
import time
from typing import Optional, Sequence

import torch

from .._io import atomic_write_text, read_json
from ..runtime.config import check_distinct
from ..runtime.report import markdown_table
from ..train.config import configs_dir, Config

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
REPORT = "report.md"  # the table, in the output folder


def reproduce_fmnist(
    output: str = "runs/fmnist",
    epochs: Optional[int] = None,
    variants: Sequence[str] = tuple(LABELS),
    config_dir: Optional[str] = None,
) -> tuple[list[dict], Optional[dict]]:
    """Train (or resume) each variant into ``output/<variant>``, then tabulate into
    ``output/report.md``; returns (table rows, the summary of the run a signal stopped, else None).
    Running it again continues where it stopped."""
    from ..train.task import train
    from ..train.evaluate import inference_throughput, load_trained_model

    check_distinct("variants", variants)
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
    report = atomic_write_text(pathlib.Path(output) / REPORT, table)
    print(f"table written to {report}")
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
