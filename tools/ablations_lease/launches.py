"""What a GPU would launch for one ablation training step, counted on the CPU, and the step time it implies.

Run eagerly on a GPU, a step of the ablation models (24-96 channels) waits on the host's launches.
:func:`step_launches` runs one training step (the resident step of ``resident.py``: gather,
flip, resize, model, label-smoothed loss, backward, clipping, the fused AdamW a CUDA device uses)
under a dispatch mode that counts the aten ops that launch a kernel (views and allocations do
not) with the bytes each reads and writes. Run at two batch sizes, each op's bytes are
``a + b * batch`` (the op sequence does not change with the batch), which gives them at
the lease's batch of 256.

:func:`graphed_step_ms` turns a count into a step time, as an estimate: replayed from a CUDA graph
each kernel costs at least ``KERNEL_FLOOR_US`` (a graph node's launch and a small kernel's run),
else its bytes at ``BANDWIDTH_SHARE`` of the device's memory bandwidth; the matmuls' FLOPs are
added at ``FLOPS_SHARE`` of its fp32 rate. The constants are assumptions, not measurements: the
lease's first runs measure the step (``step_ms`` in their records) and the runner plans the rest
of its time from those. By this estimate a graphed step is bound by its bytes, not its launches.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from collections import Counter
from typing import Optional, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from tools.files import atomic_write_text

# ops that only make views or allocate: no kernel launch on a GPU
NO_LAUNCH = frozenset(
    "detach view _unsafe_view t transpose expand as_strided unsqueeze squeeze permute slice split select alias "
    "split_with_sizes reshape empty empty_like empty_strided new_empty new_empty_strided promote_types "
    "unbind lift_fresh".split()
    # a read of a scalar on the host: a CPU AdamW reads its step counters so; the capturable
    # AdamW of a CUDA graph keeps them on the device and reads none
    + ["_local_scalar_dense"]
)
# per device: (memory bandwidth GB/s, dense fp32 TFLOP/s), the vendors' figures for the SXM parts
DEVICES = {"H100": (3350.0, 67.0), "H200": (4800.0, 67.0)}
KERNEL_FLOOR_US = 3.0
BANDWIDTH_SHARE = 0.5
FLOPS_SHARE = 0.3


def _bytes(tree) -> int:
    total = 0
    for t in tree if isinstance(tree, (list, tuple)) else [tree]:
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
        elif isinstance(t, (list, tuple)):
            total += _bytes(t)
    return total


class LaunchLog(TorchDispatchMode):
    """Each dispatched op that would launch a kernel: (name, bytes of its tensor arguments and results)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        # an op returning its input unchanged (a ``to`` to the same dtype) launches nothing; an
        # in-place op (``copy_``, ``add_``) returns its input too, and launches
        if name not in NO_LAUNCH and (name.endswith("_") or not any(out is a for a in args)):
            self.ops.append((name, _bytes(list(args)) + _bytes(list((kwargs or {}).values())) + _bytes(out)))
        return out

    def counts(self) -> Counter:
        return Counter(name for name, _ in self.ops)


def one_step(run, batch: int) -> tuple[LaunchLog, float]:
    """One resident training step of ``run`` (a :class:`~.resident.ResidentRun`) on ``batch`` images
    -> (its launch log, its FLOPs), AdamW fused as :func:`~inline_attn.runtime.optim.build_optimizer`
    builds it on CUDA (one kernel a parameter group)."""
    for group in run.optimizer.param_groups:
        group["fused"], group["foreach"] = True, False
    from inline_attn.runtime.graphs import train_step

    idx = torch.arange(batch)
    train_step(run.train_model, run.optimizer, run.loss_fn, idx, idx, clip_grad=run.cfg.optim.clip_grad)  # state made
    flops = FlopCounterMode(display=False)
    with LaunchLog() as log, flops:
        train_step(run.train_model, run.optimizer, run.loss_fn, idx, idx, clip_grad=run.cfg.optim.clip_grad)
    return log, float(flops.get_total_flops())


def step_launches(make_run, batch: int, small: Sequence[int] = (2, 4)) -> dict:
    """Launches, bytes and FLOPs of one training step at ``batch``, extrapolated from the batches
    ``small`` (``make_run(b)``: a fresh run with batch ``b``)."""
    (log_a, f_a), (log_b, f_b) = (one_step(make_run(b), b) for b in small)
    names_a, names_b = [n for n, _ in log_a.ops], [n for n, _ in log_b.ops]
    if names_a != names_b:
        raise RuntimeError(f"the step's ops differ between batches {small}: {len(names_a)} vs {len(names_b)}")
    ba, bb = small
    per_op = [a + (b - a) * (batch - ba) / (bb - ba) for (_, a), (_, b) in zip(log_a.ops, log_b.ops)]
    flops = f_a + (f_b - f_a) * (batch - ba) / (bb - ba)
    return {
        "launches": len(per_op),
        "batch": batch,
        "bytes": [int(max(b, 0)) for b in per_op],
        "flops": flops,
        "by_op": dict(log_a.counts().most_common()),
    }


def graphed_step_ms(launch: dict, device: str = "H100") -> float:
    """The estimated step time (ms) of ``launch`` (:func:`step_launches`) replayed as a CUDA graph on ``device``."""
    bandwidth, tflops = DEVICES[device]
    bytes_per_us = bandwidth * 1e3 * BANDWIDTH_SHARE  # GB/s -> bytes a microsecond
    kernels_us = sum(max(KERNEL_FLOOR_US, b / bytes_per_us) for b in launch["bytes"])
    return (kernels_us + launch["flops"] / (tflops * 1e6 * FLOPS_SHARE)) / 1000.0


def _replay_nothing(fn, *, warmup: int = 3, pool=None):
    """A capture stand-in whose replay launches nothing: what remains is the host's part of a step."""
    out = fn()
    return (lambda: out), None


def host_launches_per_step(run, steps: int = 4) -> float:
    """Launches the host makes a step outside the replay in ``run``'s training loop (the replay
    itself is one graph launch on a GPU, counted on top)."""
    idx = torch.arange(run.batch)
    run.capture_fn, run.why_not = _replay_nothing, None
    run._first_step(idx)
    losses = torch.zeros(steps)
    with LaunchLog() as log:
        for i in range(steps):  # the loop's body in ResidentRun.train
            losses[i].copy_(run.step_fn(idx, idx))
            run.sched.step()
    # + 1: the replay, one graph launch; + 1: the lr the schedule writes into the optimizer's
    # tensor lr on CUDA (a CPU run keeps a float, written without a launch)
    return len(log.ops) / steps + 2


def synthetic_data(n: int = 8):
    """Random uint8 Fashion-MNIST-shaped data: the counts do not depend on the images."""
    from .resident import ResidentData

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=g)
    labels = torch.arange(n) % 10
    return ResidentData(images, labels, images.clone(), labels.clone())


def measure(parts: str = "abcd", batch: int = 256, overrides: Sequence[tuple] = ()) -> dict:
    """{setting key: launches a step, FLOPs, bytes, estimated graphed step ms on an H100 and an H200}
    for the settings of ``parts``, and the host's launches a step of the resident loop."""
    from inline_attn.train.config import Config, configs_dir
    from inline_attn.experiments.ablations import ABLATION_CONFIG, plan
    from .resident import ResidentRun

    data, cdir = synthetic_data(), configs_dir()

    def make(setting, b):
        ov = [*setting.overrides, ("data.batch_size", b), *overrides]
        return ResidentRun(Config.load(cdir / ABLATION_CONFIG, ov), data, torch.device("cpu"))

    out: dict = {"batch": batch, "settings": {}}
    for setting in dict.fromkeys(s for s, _ in plan(parts, [0])):
        launch = step_launches(lambda b, s=setting: make(s, b), batch)
        out["settings"][setting.key] = {
            "launches": launch["launches"],
            "gflop": round(launch["flops"] / 1e9, 2),
            "gbytes": round(sum(launch["bytes"]) / 1e9, 3),
            "est_ms": {d: round(graphed_step_ms(launch, d), 2) for d in DEVICES},
            "by_op": dict(list(launch["by_op"].items())[:12]),
        }
        print(setting.key, out["settings"][setting.key]["launches"], out["settings"][setting.key]["est_ms"], flush=True)
    out["host_launches_per_step"] = host_launches_per_step(make(plan("d", [0])[0][0], 4))
    out["assumptions"] = {
        "kernel_floor_us": KERNEL_FLOOR_US,
        "bandwidth_share": BANDWIDTH_SHARE,
        "flops_share": FLOPS_SHARE,
        "devices": DEVICES,
    }
    return out


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="abcd", help="ablation parts whose settings are counted (default abcd)")
    p.add_argument("--batch", type=int, default=256, help="the batch the counts are extrapolated to")
    p.add_argument("--out", help="JSON file for the counts (default: print only)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    res = measure(args.parts, args.batch)
    if args.out:
        atomic_write_text(pathlib.Path(args.out), json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: (v["launches"], v["est_ms"]) for k, v in res["settings"].items()}, indent=1))
    print("host launches a step (replay included):", res["host_launches_per_step"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
