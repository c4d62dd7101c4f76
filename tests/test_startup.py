"""Start-up stays fast: ``import inline_attn`` and ``inline-attn --help`` load only what they need, and
building the models never imports ``torch._dynamo`` (about 1 s of CPU) or the flop counter."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import inline_attn
from inline_attn.cli import COMMANDS, build_parser

SRC = str(pathlib.Path(inline_attn.__file__).resolve().parent.parent)


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code`` (this checkout's src first)."""
    env = {**os.environ, "PYTHONPATH": SRC}
    script = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_importing_the_models_and_layers_imports_no_dynamo():
    loaded = loaded_after("import inline_attn\ninline_attn.create_model, inline_attn.InLineAttention")
    assert "inline_attn.models.deit" in loaded and "inline_attn.ops.fused.cpu" in loaded
    assert "torch._dynamo" not in loaded
    assert "torch.utils.flop_counter" not in loaded


def test_import_inline_attn_alone_loads_no_torch_and_names_resolve():
    assert "torch" not in loaded_after("import inline_attn")
    assert set(dir(inline_attn)) >= set(inline_attn.__all__)
    from inline_attn import create_model, load_checkpoint  # noqa: F401  (PEP 562 names import like any other)


def test_help_imports_no_torch():
    loaded = loaded_after("from inline_attn.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass")
    assert "torch" not in loaded
    assert not {m for m in loaded if m.startswith("inline_attn.cli.")}


def test_the_command_table_matches_the_modules_help():
    full = build_parser()._subparsers._group_actions[0]
    assert {a.dest: a.help for a in full._choices_actions} == {name: h for name, (_, h) in COMMANDS.items()}


def test_flop_formulas_are_registered_when_the_flop_counter_is_imported_later():
    code = (
        "import torch, inline_attn.ops\n"
        "from torch.utils.flop_counter import flop_registry\n"
        "assert torch.ops.inline_attn.inline_forward in flop_registry\n"
        "assert torch.ops.inline_attn.inline_backward in flop_registry"
    )
    assert "torch.utils.flop_counter" in loaded_after(code)
