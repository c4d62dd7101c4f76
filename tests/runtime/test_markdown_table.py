"""The one Markdown table writer of the reports (ablations, reproduce, dense compare, the analyses,
gpu-check, bench)."""

from inline_attn.runtime.report import markdown_row, markdown_table


def test_a_table_is_its_header_its_rule_and_one_line_per_row():
    lines = markdown_table([["inline", 1.5], ["softmax", None]], ["kind", "top-1 (%)"])
    assert lines == ["| kind | top-1 (%) |", "|---|---|", "| inline | 1.5 |", "| softmax | None |"]
    assert markdown_table([], ["a", "b", "c"]) == ["| a | b | c |", "|---|---|---|"]


def test_an_empty_cell_is_one_space_wide():
    assert markdown_row(["Agent attention", "", "", "not run"]) == "| Agent attention | | | not run |"
    assert markdown_row(["", ""]) == "| | |"  # a header without names
