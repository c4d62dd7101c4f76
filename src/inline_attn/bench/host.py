"""Host time of one attention layer's forward + backward at a tiny shape: InLine against SDPA.

At a tiny shape (B 1, 4 x 4 tokens, C 96, 3 heads, one CPU thread) the arithmetic is negligible,
so the CPU time of a layer step is its host time: Python, autograd, dispatch and the aten ops
around the attention core. A small model's eager GPU step waits on exactly that. The cases:

- ``sdpa``: the softmax layer (``F.scaled_dot_product_attention``), the baseline;
- ``inline-cpu``: the InLine layer on the C++ kernel, as it runs;
- ``inline-triton-stub``: the InLine layer on the Triton path with its kernel launches stubbed
  out (the launchers' host work, the tensors they allocate and the launch cache's key and lookup,
  no kernel), so the CPU measures what a GPU step's host pays, but for the driver's launch itself;
- ``inline-eager``: the InLine layer on aten ops only (for reference).

With ``--model NAME`` the step is a whole model's (B 1, a small image: 32 px by default, DeiT's
2 x 2 patches and the cls token), ``sdpa`` being the same model with softmax attention everywhere
(pattern all ``S``: for ``inline_deit_tiny``, DeiT-T's layers with InLine-DeiT-T's 6 heads, which
run the same aten ops as DeiT-T's 3).

Run ``python -m inline_attn.bench.host`` (``--help`` for the options); it prints the medians of
interleaved runs (this thread's CPU time per step) and each InLine case's ratio to ``sdpa``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections import Counter
from typing import Callable, Iterator

import torch

from ..layers import build_attention
from ..models import create_model
from ..ops import use_impl
from ..ops.fused import launch_cache
from ..ops.fused import triton as triton_core
from .timing import thread_times_interleaved

CASES = ("sdpa", "inline-cpu", "inline-triton-stub", "inline-eager")


class _StubKernel:
    """Stands in for a Triton kernel: ``kernel[grid](*args)`` looks the launch up in the launch
    cache as a GPU launch does (:func:`~inline_attn.ops.fused.launch_cache.lookup`), then does
    nothing (the launch is skipped, its outputs stay uninitialised) but count itself in
    ``skipped``; ``fn.__name__`` as the launch log reads it."""

    def __init__(self, kernel, skipped: Counter):
        self.fn, self.skipped = kernel.fn, skipped

    def __getitem__(self, grid):
        return self._skip

    def _skip(self, *args, **kwargs) -> None:
        launch_cache.lookup(self, 0, args, kwargs)
        self.skipped[self.fn.__name__] += 1


@contextlib.contextmanager
def stubbed_triton_launches() -> Iterator[Counter]:
    """Every fused-launch kernel of the Triton layer core does nothing inside the block (CPU
    tensors: the launchers run as on a GPU, under the interpreter's module, without its kernels).
    Yields the skipped launches by kernel name."""
    mod = triton_core.load_kernels(torch.device("cpu"))
    # the launchable kernels: the module's public jit functions (its helpers' names begin with _)
    saved = {name: k for name, k in vars(mod).items() if not name.startswith("_") and hasattr(k, "fn")}
    skipped: Counter = Counter()
    try:
        for name, kernel in saved.items():
            setattr(mod, name, _StubKernel(kernel, skipped))
        yield skipped
    finally:
        for name, kernel in saved.items():
            setattr(mod, name, kernel)


def _impl(case: str) -> str | None:
    return {"sdpa": None, "inline-cpu": "cpu", "inline-triton-stub": "triton", "inline-eager": "eager"}[case]


def layer_steps(
    cases=CASES, *, dim: int = 96, heads: int = 3, grid: tuple[int, int] = (4, 4), batch: int = 1
) -> dict[str, Callable[[], None]]:
    """case -> one forward + backward of that layer on x [batch, H*W, dim] (a closure; the
    Triton case must run inside :func:`stubbed_triton_launches`)."""
    torch.manual_seed(0)
    x = torch.randn(batch, grid[0] * grid[1], dim, requires_grad=True)
    steps = {}
    for case in cases:
        if case not in CASES:
            raise ValueError(f"unknown case {case!r}: expected one of {CASES}")
        layer = build_attention("softmax" if case == "sdpa" else "inline", dim, heads, impl=_impl(case))

        def step(layer=layer, params=(x, *layer.parameters())):
            for p in params:  # fresh gradients, as after an optimizer's zero_grad (not timed as the layer's)
                p.grad = None
            layer(x, grid).sum().backward()

        steps[case] = step
    return steps


def model_steps(cases=CASES, *, name: str = "inline_deit_tiny", img_size: int = 32, **overrides):
    """case -> one forward + backward of model ``name`` on one image [1, 3, img_size, img_size]
    (a closure, as :func:`layer_steps`); ``sdpa`` is the model with softmax attention everywhere
    (pattern all ``S``), the others the InLine model on that path. ``overrides`` go to
    :func:`~inline_attn.models.create_model` (``depth=1`` for a quick look)."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, img_size, img_size)
    steps = {}
    for case in cases:
        if case not in CASES:
            raise ValueError(f"unknown case {case!r}: expected one of {CASES}")
        if case == "sdpa":  # a model's pattern has one letter per stage
            stages = len(create_model(name, img_size=img_size, **overrides).pattern)
            model = create_model(name, img_size=img_size, pattern="S" * stages, **overrides)
        else:
            model = create_model(name, img_size=img_size, impl=_impl(case), **overrides)

        def step(model=model, params=tuple(model.parameters())):
            for p in params:  # fresh gradients, as after an optimizer's zero_grad
                p.grad = None
            model(x).sum().backward()

        steps[case] = step
    return steps


def python_calls(step: Callable[[], None]) -> Counter:
    """The Python functions ``step`` calls (``sys.setprofile``), by ``file:function``, not counting
    ``step`` itself: what a layer step crosses in Python."""
    calls: Counter = Counter()

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            calls[f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"] += 1

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    calls[f"host.py:{step.__name__}"] -= 1
    return +calls


def bench_host(cases=CASES, *, repeats: int = 2000, threads: int = 1, model: str | None = None, **shape) -> dict:
    """Interleaved medians (us) of each case's layer step (or with ``model``, that model's step,
    :func:`model_steps`) and their ratios to ``sdpa``.

    Returns ``{"meta": {...}, "rows": [{"case", "median_us", "ratio"}]}``.
    """
    previous, flushed = torch.get_num_threads(), torch.set_flush_denormal(True)
    torch.set_num_threads(threads)
    try:
        steps = model_steps(cases, name=model, **shape) if model else layer_steps(cases, **shape)
        stub = stubbed_triton_launches() if "inline-triton-stub" in steps else contextlib.nullcontext()
        with stub, use_impl("auto"):
            times = thread_times_interleaved(steps, warmup=20, repeats=repeats)
    finally:
        torch.set_num_threads(previous)
        # the stubbed launches leave their outputs uninitialised: denormals there, and in what a
        # model computes from them, would be slow. Back to torch's default (it has no getter).
        if flushed:
            torch.set_flush_denormal(False)
    rows = [dict(case=case, median_us=statistics.median(t) * 1e6) for case, t in times.items()]
    base = next((r["median_us"] for r in rows if r["case"] == "sdpa"), float("nan"))
    for r in rows:
        r["ratio"] = r["median_us"] / base
    meta = dict(model=model, threads=threads, repeats=repeats, torch=torch.__version__, **shape)
    return dict(meta=meta, rows=rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m inline_attn.bench.host", description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--repeats", type=int, default=2000, help="interleaved timed rounds (default 2000)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", help="a whole model's step (e.g. inline_deit_tiny) instead of one layer's")
    ap.add_argument("--img-size", type=int, default=32, help="the model's input side in px (default 32)")
    args = ap.parse_args(argv)
    shape = dict(model=args.model, img_size=args.img_size) if args.model else {}
    result = bench_host(args.cases, repeats=args.repeats, threads=args.threads, **shape)
    what = f"model {args.model}, B 1, {args.img_size} px" if args.model else "layer, B 1, 4x4 tokens, C 96, 3 heads"
    print(f"host time of one {what}, fwd+bwd, {args.threads} thread(s), medians:")
    for r in result["rows"]:
        print(f"  {r['case']:<20} {r['median_us']:8.1f} us  {r['ratio']:5.2f}x sdpa")


if __name__ == "__main__":
    main()
