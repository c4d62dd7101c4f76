"""What every run needs whatever the task (classification, segmentation, detection).

- :mod:`~inline_attn.runtime.config`: typed config sections, YAML with ``_base_``, dotted
  overrides, did-you-mean, type and range checks, ``--section.key`` flag generation;
- :mod:`~inline_attn.runtime.checkpoint`: atomic rotating checkpoints, one resume path;
- :mod:`~inline_attn.runtime.run`: the one training run, its log window and best checkpoints;
  :mod:`~inline_attn.runtime.task`: what a task supplies to it (:class:`~inline_attn.runtime.task.Task`,
  its cadence, the micro-batches of a step);
- :mod:`~inline_attn.runtime.signals`: SIGINT / SIGTERM stop a run at a step boundary, with a
  checkpoint and the 128 + signum exit;
- :mod:`~inline_attn.runtime.output`: the output folder's rule (one run at a time, its lock; a
  finished or interrupted run is continued or explicitly replaced, never overwritten by accident);
- :mod:`~inline_attn.runtime.graphs`: CUDA-graphed training and evaluation steps, and why a
  step cannot be captured; :mod:`~inline_attn.runtime.compile`: the torch.compile modes;
- :mod:`~inline_attn.runtime.optim` (optimizers, schedules, the optimizer step with amp's
  GradScaler and clipping), :mod:`~inline_attn.runtime.amp`,
  :mod:`~inline_attn.runtime.distributed`, :mod:`~inline_attn.runtime.ema`,
  :mod:`~inline_attn.runtime.report` (run records and the Markdown table writer).

It imports nothing from the task packages (``train``, ``dense``) above it.
"""
