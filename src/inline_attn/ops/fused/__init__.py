"""The fused InLine layer core: one custom op (:mod:`.op`) with two backends.

- :mod:`.cpu`: the C++ kernel (:mod:`.cpu_build` compiles ``csrc/inline_cpu.cpp`` into a cache);
- :mod:`.triton`: the launcher of the Triton kernels (:mod:`.triton_stream`, :mod:`.triton_kernels`,
  both written with :mod:`.triton_tiles`), on CUDA or under Triton's interpreter (:mod:`._triton_env`
  picks the interpreter before triton is imported).

Callers use :func:`inline_attn.ops.inline_tokens`; :func:`.op.inline_core` is the entry the
dispatcher calls.
"""

from . import _triton_env  # noqa: F401  (must run before anything imports triton)
