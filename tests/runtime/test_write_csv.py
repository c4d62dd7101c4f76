"""The run-record writers: the CSV header from given columns or from the rows themselves."""

from __future__ import annotations

from inline_attn.runtime.report import write_csv


def test_write_csv_given_columns_ignores_extras_and_blanks_missing(tmp_path):
    path = tmp_path / "m.csv"
    write_csv([{"epoch": 0, "loss": 1.5, "note": "x"}, {"epoch": 1, "loss": None}], path, ["epoch", "loss"])
    assert path.read_bytes() == b"epoch,loss\r\n0,1.5\r\n1,\r\n"


def test_write_csv_without_columns_takes_every_key_in_first_seen_order(tmp_path):
    path = tmp_path / "a.csv"
    write_csv([{"model": "m", "layer": 0}, {"layer": 1, "v": 0.5, "model": "n"}, {"w": "a,b"}], path)
    assert path.read_bytes() == b'model,layer,v,w\r\nm,0,,\r\nn,1,0.5,\r\n,,,"a,b"\r\n'


def test_write_csv_without_columns_or_rows_is_an_empty_file(tmp_path):
    path = tmp_path / "e.csv"
    write_csv([], path)
    assert path.read_bytes() == b""
