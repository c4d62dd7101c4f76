"""The ops tests' launch counter (op_helpers.LaunchCount): what it counts as a kernel launch."""

from __future__ import annotations

import torch

from op_helpers import LaunchCount


def test_launch_count_counts_in_place_and_out_ops_not_views_or_no_op_casts():
    x = torch.ones(4, 3)
    with LaunchCount() as mode:
        y = x + 1  # add
        y.add_(1)  # in place: returns y, launches one kernel
        torch.mul(x, 2, out=y)  # out= variant: returns y, launches one kernel
        y.copy_(x)  # in place
        y.view(3, 4).t()  # views: no launch
        assert y.to(torch.float32) is y  # a cast to its own dtype: no launch
    assert mode.counts == {"add": 1, "add_": 1, "mul": 1, "copy_": 1}, dict(mode.counts)
    torch.testing.assert_close(y, x)
