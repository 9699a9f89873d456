"""Parquet projection: reading 2 of 20 columns reads their column chunks (from pyarrow's own metadata) and
little else — about a tenth of the bytes of reading all 20. Skipped without pyarrow (the [data] extra)."""

import os

import numpy as np
import pytest

pytest.importorskip("pyarrow")

from minidist.data.columnar import CountingFile, column_chunk_bytes, read_columns, write_parquet

FOOTER_READ = 64 * 1024      # pyarrow reads the file's last 64 KiB at once to find the footer


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    rng = np.random.default_rng(0)
    columns = {f"f{i:02d}": rng.normal(size=20_000) for i in range(19)}
    columns["label"] = rng.integers(0, 10, size=20_000)
    path = tmp_path_factory.mktemp("columnar") / "table.parquet"
    write_parquet(path, columns, row_group_size=5_000)
    return path, columns


def measured_read(path, columns):
    f = CountingFile(path)
    try:
        return read_columns(f, columns), f.bytes_read
    finally:
        f.close()


def test_projection_reads_only_the_chosen_column_chunks(table):
    path, columns = table
    chosen = ["f03", "label"]
    data, read_two = measured_read(path, chosen)
    all_data, read_all = measured_read(path, None)
    assert list(data) == chosen and list(all_data) == list(columns)
    for name in columns:
        np.testing.assert_array_equal(all_data[name], columns[name])
    np.testing.assert_array_equal(data["label"], columns["label"])
    chunks_two, chunks_all = column_chunk_bytes(path, chosen), column_chunk_bytes(path)
    footer = os.path.getsize(path) - chunks_all                 # metadata + magic numbers
    assert chunks_two == pytest.approx(chunks_all / 10, rel=1e-3)   # 20 columns of 8 bytes a row
    for read, chunks in ((read_two, chunks_two), (read_all, chunks_all)):
        assert chunks <= read <= chunks + footer + FOOTER_READ
    assert read_two < 0.15 * read_all


def test_bad_input_is_refused(table, tmp_path):
    path, _ = table
    with pytest.raises(ValueError, match=r"no column\(s\) \['nope'\]"):
        read_columns(path, ["f01", "nope"])
    with pytest.raises(ValueError, match="1-D columns of one length"):
        write_parquet(tmp_path / "x.parquet", {"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(ValueError, match="1-D columns of one length"):
        write_parquet(tmp_path / "x.parquet", {"a": np.zeros((3, 2))})


def test_columns_are_a_list_of_whole_names(tmp_path):
    """A str used to be read letter by letter ("ab" read columns a and b), a missing name counted 0 bytes
    and a str matched column names as substrings."""
    columns = {"a": np.arange(3), "b": np.arange(3.0), "ab": np.arange(3)}
    path = write_parquet(tmp_path / "abc.parquet", columns)
    for call in (read_columns, column_chunk_bytes):
        with pytest.raises(TypeError, match="columns must be a list of column names"):
            call(path, "ab")
        with pytest.raises(TypeError, match="columns must be a list of column names"):
            call(path, 3)
        with pytest.raises(ValueError, match=r"no column\(s\) \['zz'\]"):
            call(path, ["zz"])
    assert list(read_columns(path, ("ab",))) == ["ab"]
    assert column_chunk_bytes(path, ["ab"]) < column_chunk_bytes(path, ["a", "ab"]) < column_chunk_bytes(path)
