"""Reports go where the user asks: a docs file only through --doc, checked before the work, and
a section there never replaced by one reporting fewer finished runs unless asked."""

from __future__ import annotations

import pytest

from inline_attn.cli import build_parser
from inline_attn.experiments.ablations import run_ablations, write_ablation_section
from inline_attn.experiments.dense_compare import format_table, markers, run, write_table
from inline_attn.experiments.doc_section import check_doc
from inline_attn.experiments.reproduce import reproduce_fmnist


@pytest.mark.parametrize(
    "argv", [["reproduce", "fmnist"], ["reproduce", "ablations"], ["seg", "compare"], ["det", "compare"]], ids=" ".join
)
def test_no_command_writes_a_doc_by_default(argv):
    args = build_parser().parse_args(argv)
    assert args.doc is None and args.replace_fewer is False


def _ablation_report(runs: int) -> str:
    return f"### The quick preset\n\nCommand: `x`. Runs finished: {runs} (0.1 min of training in all).\n"


def test_an_ablation_section_is_not_replaced_by_fewer_runs(tmp_path):
    doc = tmp_path / "reproduction.md"
    write_ablation_section(doc, _ablation_report(93), "quick")
    kept = doc.read_text()
    with pytest.raises(ValueError, match=r"reports 93 finished runs and this report 0.*--replace-fewer"):
        write_ablation_section(doc, _ablation_report(0), "quick")
    assert doc.read_text() == kept
    write_ablation_section(doc, _ablation_report(94), "quick")  # more runs: replaced
    assert "Runs finished: 94" in doc.read_text() and "Runs finished: 93" not in doc.read_text()
    write_ablation_section(doc, _ablation_report(1), "quick", replace_fewer=True)
    assert "Runs finished: 1 " in doc.read_text() and doc.read_text().count("ablations:begin quick") == 1


def _dense_rows(seeds):
    return [
        dict(pattern="IIII", seed=s, mIoU=30.0 + s, mAcc=40.0, aAcc=90.0, params=100, train_time_s=60.0) for s in seeds
    ]


def test_a_compare_section_is_not_replaced_by_fewer_runs(tmp_path):
    doc = tmp_path / "dense.md"
    write_table(doc, format_table(_dense_rows([0, 1, 2]), command="c", config="c.yaml"))
    kept = doc.read_text()
    with pytest.raises(ValueError, match=r"reports 3 finished runs and this report 1"):
        write_table(doc, format_table(_dense_rows([0]), command="c", config="c.yaml"))
    assert doc.read_text() == kept
    write_table(doc, format_table(_dense_rows([0]), command="c", config="c.yaml"), replace_fewer=True)
    assert doc.read_text().count(markers("seg")[0]) == 1 and "| 0 |" in doc.read_text()


def _no_training(*args, **kwargs):
    raise AssertionError("trained before checking --doc")


def test_an_unwritable_doc_stops_every_command_before_any_work(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    doc = str(blocker / "doc.md")
    monkeypatch.setattr("inline_attn.train.task.train", _no_training)
    monkeypatch.setattr("inline_attn.experiments.dense_compare.compare", _no_training)
    for call in (
        lambda: reproduce_fmnist(output=str(tmp_path / "runs"), doc=doc),
        lambda: run_ablations("quick", output=str(tmp_path / "runs"), doc=doc, progress=False),
        lambda: run("c.yaml", patterns=["IIII"], seeds=[0], output=str(tmp_path), doc=doc, command="c"),
    ):
        with pytest.raises(ValueError, match=rf"--doc's folder {blocker} is not a folder"):
            call()
    with pytest.raises(ValueError, match="is a folder: expected a markdown file"):
        check_doc(tmp_path)


def test_replace_fewer_without_a_doc_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"--replace-fewer \(replace_fewer=True\) needs --doc"):
        run_ablations("quick", output=str(tmp_path / "runs"), replace_fewer=True, progress=False)


def test_a_negative_run_limit_is_refused(tmp_path):
    # --max-runs -1 once trained nothing and reported an empty table
    with pytest.raises(ValueError, match=r"max_runs must be >= 0 \(0: no limit\), got -1"):
        run_ablations("quick", output=str(tmp_path / "runs"), max_runs=-1, progress=False)
