"""``inline-attn analyze`` ends with its headline number per model, read from the JSON it wrote."""

from __future__ import annotations

import pathlib

import pytest

from inline_attn.analysis.analyze import describe_result

FIGURES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "figures" / "analysis"


@pytest.mark.parametrize(
    "analysis, expected",
    [
        ("injectivity", "collinear: softmax 4/4, linear_relu 1/4"),
        ("confusion", "confused query pairs per image, mean: softmax 0.0, linear 34.7"),
        ("locality", "softmax 1.07x"),
        ("masking", "softmax 80.53 -> 51.33"),
    ],
)
def test_headline_from_the_written_json(analysis, expected):
    text = describe_result(analysis, FIGURES, [FIGURES / f"{analysis}.png"])
    first, last = text.splitlines()
    assert expected in first and last == f"wrote {analysis}.png to {FIGURES}"


def test_no_headline_for_pictures_or_other_layouts(tmp_path):
    assert describe_result("attention-maps", FIGURES, ["a.png"]) == f"wrote a.png to {FIGURES}"
    (tmp_path / "confusion.json").write_text('{"summary": {"x": {}}}')
    assert describe_result("confusion", tmp_path, ["c.png"]) == f"wrote c.png to {tmp_path}"
