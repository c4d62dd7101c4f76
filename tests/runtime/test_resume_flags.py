"""What may change when a run is resumed is declared on each setting (``setting(..., resume=True)``)
and read by :meth:`TypedConfig.differences`: where the data and outputs are, how the run is executed
and watched, when it stops. Everything else shapes the training."""

from __future__ import annotations

from inline_attn.dense.config import DetConfig, SegConfig
from inline_attn.runtime.config import setting_flags
from inline_attn.train.config import Config

WATCH = {"train.output", "train.resume", "train.overwrite", "train.progress", "train.threads", "train.max_steps"}
# how every run executes (runtime.config.RunCfg)
WATCH |= {"train.tensorboard", "train.compile", "train.compile_mode", "train.cuda_graphs", "train.channels_last"}
DENSE = WATCH | {"data.path", "data.workers", "data.val_subset", "train.log_interval", "train.checkpoint_interval"}
DENSE |= {"train.predictions_png", "eval.interval", "eval.batch_size"}
EXPECTED = {
    Config: WATCH | {"data.path", "data.workers", "train.eval_every"},
    SegConfig: DENSE | {"eval.mode", "eval.crop_size", "eval.stride", "eval.flip"},
    DetConfig: DENSE | {f"data.coco.{k}" for k in ("train_ann", "train_images", "val_ann", "val_images")},
}


def test_each_config_flags_exactly_the_settings_a_resume_may_change():
    for config, expected in EXPECTED.items():
        flagged = {key for key, f, *_ in setting_flags(config) if f.metadata["resume"]}
        assert flagged == expected, config.__name__


def test_differences_skip_flagged_settings_and_name_the_others():
    saved = SegConfig().to_dict()
    now = SegConfig().replace(**{"train.max_steps": 3, "eval.mode": "slide", "sched.iters": 7, "data.batch_size": 3})
    assert now.differences(saved) == ["data.batch_size: 2 -> 3", "sched.iters: 40000 -> 7"]
