"""Progress bars: none in a log (stderr not a terminal), and an ETA that ignores the warm-up step."""

from __future__ import annotations

import io
import re

from tqdm import tqdm

from inline_attn.runtime.progress import bars_shown, progress_bar, restart_clock


def test_no_bar_and_no_escape_codes_when_stderr_is_not_a_terminal(capsys):
    assert not bars_shown(True)  # pytest captures stderr: a file, as in a log
    for _ in progress_bar(range(50), desc="eval", leave=False):
        pass
    assert capsys.readouterr().err == ""


def eta(bar) -> str:
    return re.search(r"<([\d:?]+)", tqdm.format_meter(**bar.format_dict)).group(1)


def test_the_eta_leaves_out_the_warm_up_step():
    bar = tqdm(total=1000, file=io.StringIO(), smoothing=0, mininterval=0)
    bar.start_t -= 35.0  # the first step took 35 s (kernel build, compile)
    bar.update(1)
    assert eta(bar).count(":") == 2  # hours: what the bar showed before
    restart_clock(bar)
    bar.start_t -= 1.0  # then 10 steps a second
    bar.update(10)
    minutes, seconds = map(int, eta(bar).split(":"))  # 989 steps at 10 / s: about 1:39
    assert 90 <= 60 * minutes + seconds <= 110
    bar.close()
