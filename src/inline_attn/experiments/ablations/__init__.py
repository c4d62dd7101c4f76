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
:data:`.settings.GPU_OVERRIDES`); their outputs go to separate folders.

Modules: :mod:`.settings` (the grid: parts, settings, presets, the plan), :mod:`.runs` (training the
grid, :func:`run_ablations`), :mod:`.measure` (masking and inference speed of the trained runs),
:mod:`.verdicts` (statistics over seeds and the verdicts), :mod:`.report` (the markdown tables),
:mod:`.plot` (part f's figure), :mod:`.finished` (the finished runs of an output folder).
"""

from ...train.config import FMNIST_VARIANTS
from .finished import part_d_runs
from .report import render, table_a, table_b, table_c, table_d
from .runs import run_ablations
from .settings import (
    ABLATION_CONFIG,
    COMPARED,
    FEATURE_MAPS_A,
    NAMES,
    PARTS,
    PRESETS,
    Budget,
    Setting,
    part_settings,
    plan,
    swin_setting,
    unique,
)
from .verdicts import compare, fmt, verdict

__all__ = [
    "ABLATION_CONFIG",
    "COMPARED",
    "FEATURE_MAPS_A",
    "FMNIST_VARIANTS",
    "NAMES",
    "PARTS",
    "PRESETS",
    "Budget",
    "Setting",
    "compare",
    "fmt",
    "part_d_runs",
    "part_settings",
    "plan",
    "render",
    "run_ablations",
    "swin_setting",
    "table_a",
    "table_b",
    "table_c",
    "table_d",
    "unique",
    "verdict",
]
