"""Statistics over seeds and the verdicts on the paper's claims: mean +- std cells, Welch-style
comparisons (a side wins when the gap exceeds twice its standard error) and one line per claim."""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence


def mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return float("nan"), float("nan"), 0
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else float("nan")), len(v)


def fmt(values: Sequence[Optional[float]]) -> str:
    """ "mean ± std (n=...)" of the finite values; None values are diverged runs."""
    m, s, n = mean_std(values)
    diverged = sum(1 for v in values if v is None)
    if n == 0:
        return f"diverged ({diverged} of {diverged})" if diverged else "not run"
    cell = f"{m:.2f} ± {s:.2f} (n={n}" if n > 1 else f"{m:.2f} (n=1"
    return cell + (f"; {diverged} diverged)" if diverged else ")")


def compare(a: Sequence[float], b: Sequence[float]) -> tuple[float, str]:
    """(mean a - mean b, "a" | "b" | "tie?" | "not run"): a side wins when the gap exceeds twice its standard
    error (Welch); fewer than two runs a side is never clear."""
    ma, sa, na = mean_std(a)
    mb, sb, nb = mean_std(b)
    if na == 0 or nb == 0:
        return float("nan"), "not run"
    if na < 2 or nb < 2:
        return ma - mb, "tie?"
    se = math.sqrt(sa**2 / na + sb**2 / nb)
    d = ma - mb
    return d, ("a" if d > 2 * se else "b" if -d > 2 * se else "tie?")


def verdict(outcomes: Sequence[str], claimed: str = "a") -> str:
    """agrees: every comparison clear in the claimed direction; differs: one clear against it."""
    outcomes = [o for o in outcomes if o != "not run"]  # a comparison without runs says nothing
    if not outcomes:
        return "not run"
    if any(o not in (claimed, "tie?") for o in outcomes):
        return "differs"
    return "agrees" if all(o == claimed for o in outcomes) else "inconclusive at this budget"


def tally(claim: str, outcomes: Sequence[str], better: str, worse: str) -> str:
    """A verdict line: ``claim: **verdict** (better A of N, worse B).``, A and B the comparisons
    clearly for ('a') and against ('b') the claim."""
    counts = f"{better} {outcomes.count('a')} of {len(outcomes)}, {worse} {outcomes.count('b')}"
    return f"{claim}: **{verdict(outcomes)}** ({counts})."


def top1s(results: dict, key: str) -> list[float]:
    return [r["top1"] for r in results.get(key, [])]
