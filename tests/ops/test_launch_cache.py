"""The launch cache's key is never coarser than Triton's own specialization (:mod:`inline_attn.ops.fused.launch_cache`).

The cache launches the kernel Triton compiled for the first call with a key; a later call with
the same key but arguments Triton would compile differently (an unaligned pointer, a stride of 1)
would run the wrong binary. Here Triton's own binder (compile mode, for sm_90, no GPU needed)
specializes families of argument lists of the resident forward's signature (one argument run
through a pool of values), and the lists of a family that share a key must share a
specialization. The binder needs Triton in compile mode, so the check runs in a subprocess (this
process interprets on a machine without CUDA).
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

META = dict(D=32, BD=32, NP=256, HAS_RES=True, PREC="tf32", SERIAL_TAPS=True, num_warps=8)


INTS = [0, 1, 2, 3, 16, 17, 48, 197, 2**31 + 16, 2**31 + 1, 2**32, 2**33 + 3]
FLOATS = [1.0, 0.17677669529663687]


def _tensors(dtype) -> list[torch.Tensor]:
    """Views of one storage with data 16-byte aligned and not, two of each."""
    storage = torch.zeros(4096, dtype=dtype)
    return [storage[off : off + 1024] for off in (0, 1, 3, 8)]


def _families(bases: int = 40) -> list[list[tuple]]:
    """Argument lists of (Q, K, V, W9, O, q_st, k_st, v_st, geo, scale): from random bases, each
    family changes one argument (one element of a tuple) through every value of its pool."""
    rng = random.Random(0)
    pool = _tensors(torch.bfloat16) + _tensors(torch.float32)
    families = []
    for _ in range(bases):
        flat = [rng.choice(pool) for _ in range(5)] + [rng.choice(INTS) for _ in range(15)] + [rng.choice(FLOATS)]
        for i, choices in enumerate([pool] * 5 + [INTS] * 15 + [FLOATS]):
            family = []
            for value in choices:
                v = flat[:i] + [value] + flat[i + 1 :]
                family.append((*v[:5], tuple(v[5:8]), tuple(v[8:11]), tuple(v[11:14]), tuple(v[14:20]), v[20]))
            families.append(family)
    return families


def check() -> dict:
    """Group each family's lists by the cache's key -> where one key got two of Triton's specializations."""
    from tools.kernel_audit import TARGETS, compiling_for
    from inline_attn.ops.fused import triton_kernels
    from inline_attn.ops.fused.launch_cache import specialization

    target = TARGETS[-1]
    kernel = triton_kernels.inline_fwd_resident
    coarse, specs, shared = [], set(), 0
    with compiling_for(target):
        binder = kernel.device_caches[target.capability][-1]
        for f, family in enumerate(_families()):
            groups: dict = {}
            for args in family:
                spec = repr(binder(*args, **META)[1])
                specs.add(spec)
                groups.setdefault(specialization(args), set()).add(spec)
            shared += len(family) - len(groups)  # lists that met another one's key
            coarse += [f for group in groups.values() if len(group) > 1]
    return {"specializations": len(specs), "lists_sharing_a_key": shared, "coarse": coarse}


def test_the_key_separates_whatever_triton_compiles_differently():
    repo = str(pathlib.Path(__file__).resolve().parents[2])  # where tools/ is
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["coarse"] == [], result["coarse"][:5]
    # the families reach many of Triton's specializations, and many lists share a key with another
    # (integers are keyed by value, tensors by address modulo 16: the lists that vary a tensor
    # between two aligned views or vary the float)
    assert result["specializations"] >= 100 and result["lists_sharing_a_key"] >= 400, result


def test_the_key_of_tensors_and_scalars():
    from inline_attn.ops.fused.launch_cache import specialization

    a, b = _tensors(torch.float32)[:2]
    assert specialization((a,)) != specialization((b,))  # 16-byte aligned or not
    assert specialization((a,)) != specialization((a.bfloat16(),))
    assert specialization(((1, 16, 17),)) != specialization(((2, 16, 17),))
    assert specialization(((16,),)) != specialization(((48 + 1,),))
    assert specialization((2**31,)) != specialization((16,))
    assert specialization((1.0,)) == specialization((0.5,))  # floats are not specialized by value
    assert specialization((True,)) != specialization((False,))
    assert specialization(((16, 32),)) != specialization(((16, 48),))  # by value: finer than Triton's


def test_only_tuples_of_integers_are_cached():
    from inline_attn.ops.fused import launch_cache

    class Compiled:
        run, function, packed_metadata = "run", "function", "packed"

    class Kernel:
        arg_names = ["X", "shape", "BLOCK"]

    def entry(shape, meta=None):
        return launch_cache._entry(Kernel, Compiled, (torch.zeros(2), shape), {"BLOCK": 16} if meta is None else meta)

    assert entry((2, 3)) == ("run", "function", "packed", (16,))
    for shape in ((2, 0.5), (2, torch.zeros(1)), (2, None)):  # a tuple of anything but integers
        assert entry(shape) is launch_cache._NOT_CACHED
    assert entry((2, 3), meta={}) is launch_cache._NOT_CACHED  # BLOCK not given: Triton's default


if __name__ == "__main__":  # the subprocess of the first test (compile mode)
    print(json.dumps(check()))
