"""The repository's own tools, outside the installed package: run from the repository root as
``PYTHONPATH=src python -m tools.NAME`` (or with inline-attn installed). They import
:mod:`inline_attn` through its public names only.

- :mod:`.gpu_check`: ``make gpu-check``, the GPU checks of one lease (the native tests, the goal
  table, the profile), each step in its own time box.
- :mod:`.kernel_audit`: ``make kernel-audit``, the Triton kernels' resources on sm_80 / 86 / 89 / 90,
  compiled without a GPU; :mod:`.kernel_phases`: their barrier phases per program read from the
  SASS, and the waves and phase-waves that predict their GPU time.
- :mod:`.floor`: the floor arithmetic of the goal table in docs/benchmarks.md.
"""
