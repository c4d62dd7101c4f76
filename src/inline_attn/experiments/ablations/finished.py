"""The finished runs of an ablation output folder, for the commands that read them (``analyze
--kinds`` takes part d's trained models)."""

from __future__ import annotations

import pathlib
from typing import Optional, Sequence

from ..._io import read_json
from .settings import COMPARED, PRESETS, swin_setting


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
