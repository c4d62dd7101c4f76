"""The model card (``README.md``) of a :func:`inline_attn.save_pretrained` folder: YAML front matter
as the Hugging Face Hub reads it (library, license, tags with the paper's arXiv id, the paper's
top-1 where the saved network is the published one) and a short text with the config and usage."""

from __future__ import annotations

import json

PAPER_ARXIV = "2412.06590"
PAPER_TITLE = "Bridging the Divide: Reconsidering Softmax and Linear Attention (Han et al., NeurIPS 2024)"
LICENSE = "mit"  # the library's (pyproject.toml); weights may carry their authors' terms, named in the text


def _front_matter(config: dict) -> list[str]:
    cfg = config.get("pretrained_cfg") or {}
    name = config["architecture"]
    lines = [
        "---",
        "library_name: inline-attn",
        f"license: {LICENSE}",
        "pipeline_tag: image-classification",
        "tags:",
        "- image-classification",
        "- inline-attn",
        "- linear-attention",
        f"- arxiv:{PAPER_ARXIV}",
    ]
    top1 = cfg.get("paper_top1")
    if top1 is not None:  # only the published network's: a customised model's config has none
        lines += [
            "datasets:",
            "- imagenet-1k",
            "model-index:",
            f"- name: {name}",
            "  results:",
            "  - task:",
            "      type: image-classification",
            "    dataset:",
            "      name: ImageNet-1k",
            "      type: imagenet-1k",
            "    metrics:",
            "    - type: accuracy",
            f"      value: {top1}",
            "      name: top-1 (paper)",
        ]
    return lines + ["---"]


def model_card(config: dict) -> str:
    """README.md text for a folder whose ``config.json`` is ``config``."""
    name = config["architecture"]
    cfg = config.get("pretrained_cfg") or {}
    body = [
        "",
        f"# {name}",
        "",
        f"InLine attention model from *{PAPER_TITLE}*, arXiv:{PAPER_ARXIV}, saved by the inline-attn library.",
        "",
        "```python",
        "import inline_attn",
        "",
        'model = inline_attn.from_pretrained("path/to/this/folder")',
        "```",
        "",
        f"Input: {cfg.get('input_size')}, mean {cfg.get('mean')}, std {cfg.get('std')}, "
        f"interpolation {cfg.get('interpolation')}, crop_pct {cfg.get('crop_pct')}.",
        "",
        "## Config",
        "",
        "```json",
        json.dumps({k: config[k] for k in ("architecture", "model_args") if k in config}, indent=2, sort_keys=True),
        "```",
        "",
    ]
    if cfg.get("paper_top1") is not None:
        body.insert(6, f"ImageNet-1k top-1 reported by the paper: {cfg['paper_top1']}%.\n")
    return "\n".join(_front_matter(config) + body)
