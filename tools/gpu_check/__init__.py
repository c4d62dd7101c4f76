"""``make gpu-check``: the GPU checks of one lease, in order of value, within 8 minutes.

A developer's GPU lease is 15 minutes of device time, start-up included; one command may run 10
minutes; at most 8 files of at most 16 MB come back. So the check runs at most
:data:`.runner.TOTAL_S` seconds of steps, each in its own time box (:data:`.runner.STEPS`), and
a step that no longer fits is not started, with a line saying so:

1. ``tests`` (:mod:`.tests_step`): the native Triton and CUDA tests, in pytest-xdist workers,
   interrupted at the end of their box (pytest still prints its counts);
2. ``goals`` (:mod:`.goals_step`): the measurements behind the goal table
   (:mod:`.goals`): InLine against the project's softmax twin in one process, interleaved, with
   the SDPA backend named;
3. ``profile`` (:mod:`.profile_step`): one training step per model as the trainer builds it (fused
   AdamW), eager under ``torch.profiler`` and CUDA-graphed: the GPU-busy shares and the top kernels;
4. ``compile`` (:mod:`.compile_step`): InLine-DeiT-T compiled against eager and eager-graphed.

On demand (``--steps``): ``train`` (:mod:`.train_step`, the trainer's CUDA-graph capture),
``autotune`` (:mod:`.autotune_step`) and ``ncu`` (:mod:`.ncu_step`, Nsight Compute on InLine-DeiT-T's
layer kernels). Before the steps, a Triton cache prebuilt for the device (``make gpu-check-cache``,
:mod:`.cache_step`) is installed when it matches the device's Triton.

The results (:mod:`.output`): ``summary.md`` (the goal table with the device and the command of
each row, every step's line, the top kernels) and ``gpu_check.json``, rewritten after every part
of every step, so a run stopped by a time limit still returns what it measured; ``tests.log``,
``profile.txt``, ``errors.txt``, ``triton_tuning.json`` and ``ncu.csv`` where their steps ran. Checkpoints and
run folders stay in a scratch folder outside the results. Run it as ``python -m
tools.gpu_check`` (:mod:`.runner`).
"""
