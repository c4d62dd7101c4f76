"""The ablations' lease preset (``make ablations-lease``): parts a-d on a GPU, in one process, within
one lease's time.

- :mod:`.lease`: the plan, the time box, the chunk files and the lease log (``python -m
  tools.ablations_lease.lease``);
- :mod:`.resident`: the run with its data on the device and its steps CUDA-graphed;
- :mod:`.launches`: the launch counts a step's time is estimated from;
- :mod:`.lease_report`: the lease's section of a markdown report, its tables and learning curves.
"""
