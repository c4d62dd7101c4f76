"""The docs writer (``tools.update_docs``): a command's report from its output folder into its
marked section of a docs file, never replaced by a report of fewer finished runs unless asked; the
library's commands take no docs file at all."""

from __future__ import annotations

import pathlib
import re
import shlex

import pytest

from inline_attn.cli import build_parser
from inline_attn.experiments.dense_compare import format_table
from inline_attn.experiments.reproduce import render_table
from tools import update_docs

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv", [["reproduce", "fmnist"], ["reproduce", "ablations"], ["seg", "compare"], ["det", "compare"]], ids=" ".join
)
def test_no_command_of_the_package_takes_a_docs_file(argv, capsys):
    for flag in (["--doc", "docs/x.md"], ["--replace-fewer"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*argv, *flag])
        assert "unrecognized arguments" in capsys.readouterr().err


def _report(folder: pathlib.Path, text: str) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.md").write_text(text)
    return folder


def _ablation_report(runs: int, preset: str = "quick") -> str:
    return f"### The {preset} preset\n\nCommand: `x`. Runs finished: {runs} (0.1 min of training in all).\n"


def test_an_ablation_section_is_not_replaced_by_fewer_runs(tmp_path):
    doc = tmp_path / "docs" / "reproduction.md"
    update_docs.update_doc("ablations", _report(tmp_path / "a", _ablation_report(93)), doc)
    kept = doc.read_text()
    assert kept.startswith("# Reproduction\n\n<!-- ablations:begin quick -->\n### The quick preset")
    with pytest.raises(ValueError, match=r"reports 93 finished runs and this report 0.*--replace-fewer"):
        update_docs.update_doc("ablations", _report(tmp_path / "b", _ablation_report(0)), doc)
    assert doc.read_text() == kept
    update_docs.update_doc("ablations", _report(tmp_path / "c", _ablation_report(94)), doc)  # more runs: replaced
    assert "Runs finished: 94" in doc.read_text() and "Runs finished: 93" not in doc.read_text()
    update_docs.update_doc("ablations", _report(tmp_path / "b", _ablation_report(0)), doc, replace_fewer=True)
    assert "Runs finished: 0 " in doc.read_text() and doc.read_text().count("ablations:begin quick") == 1
    update_docs.update_doc("ablations", _report(tmp_path / "g", _ablation_report(5, "gpu")), doc)  # its own section
    text = doc.read_text()
    assert text.count("<!-- ablations:begin") == 2 and text.index("end quick -->") < text.index("begin gpu -->")


def test_the_ablations_figure_goes_beside_the_doc(tmp_path):
    runs = _report(tmp_path / "runs", _ablation_report(3))
    (runs / "figures").mkdir()
    (runs / "figures" / "ablations_quick_fig6a.png").write_bytes(b"png")
    doc = update_docs.update_doc("ablations", runs, tmp_path / "docs" / "reproduction.md")
    assert (doc.parent / "figures" / "ablations_quick_fig6a.png").read_bytes() == b"png"


def _dense_rows(seeds):
    return [
        dict(pattern="IIII", seed=s, mIoU=30.0 + s, mAcc=40.0, aAcc=90.0, params=100, train_time_s=60.0) for s in seeds
    ]


def test_a_compare_section_replaces_its_markers_only_and_not_by_fewer_runs(tmp_path):
    doc = tmp_path / "dense.md"
    doc.write_text("# title\n\n<!-- seg-compare:begin -->\nold\n<!-- seg-compare:end -->\n\ntail\n")
    three = _report(tmp_path / "three", format_table(_dense_rows([0, 1, 2]), command="c", config="c.yaml"))
    update_docs.update_doc("seg-compare", three, doc)
    kept = doc.read_text()
    assert "old" not in kept and kept.startswith("# title") and kept.rstrip().endswith("tail")
    assert "| 31.00 +- 1.00 |" in kept
    one = _report(tmp_path / "one", format_table(_dense_rows([0]), command="c", config="c.yaml"))
    with pytest.raises(ValueError, match=r"reports 3 finished runs and this report 1"):
        update_docs.update_doc("seg-compare", one, doc)
    assert doc.read_text() == kept
    update_docs.update_doc("seg-compare", one, doc, replace_fewer=True)
    assert doc.read_text().count("<!-- seg-compare:begin -->") == 1 and "| 0 |" in doc.read_text()


def test_an_fmnist_section_counts_its_rows(tmp_path):
    row = dict(label="InLine", top1=85.0, top5=99.0, params=1, macs=None, train_img_s=1.0, infer_img_s=1.0)
    doc = tmp_path / "reproduction.md"
    update_docs.update_doc("fmnist", _report(tmp_path / "two", render_table([row, row], 60.0, None)), doc)
    with pytest.raises(ValueError, match=r"reports 2 finished runs and this report 0; the section is kept"):
        update_docs.update_doc("fmnist", _report(tmp_path / "none", render_table([], 60.0, None)), doc)
    assert doc.read_text().count("| InLine |") == 2


def test_the_command_line_says_what_is_wrong(tmp_path, capsys):
    doc = tmp_path / "doc.md"
    assert update_docs.main(["fmnist", str(tmp_path / "typo"), str(doc)]) == 2  # no report there
    assert "report.md not found: is" in capsys.readouterr().err and not doc.exists()
    runs = _report(tmp_path / "runs", "no heading\n")
    assert update_docs.main(["ablations", str(runs), str(doc)]) == 2
    assert "is it an ablation report?" in capsys.readouterr().err
    _report(runs, _ablation_report(2))
    assert update_docs.main(["ablations", str(runs), str(tmp_path)]) == 2
    assert "is a folder: expected a markdown file" in capsys.readouterr().err
    assert update_docs.main(["ablations", str(runs), str(doc)]) == 0 and "ablations:begin quick" in doc.read_text()


def test_every_documented_update_docs_command_parses():
    """The docs name this tool inline (it needs finished runs, so no block runs it): each of those
    command lines must parse with the tool's own parser."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in re.finditer(r"python -m tools\.update_docs ([^`\n]*)", path.read_text()):
            update_docs.build_parser().parse_args(shlex.split(m.group(1)))
            found.append(path.name)
    assert {"reproduction.md", "dense.md"} <= set(found), found
