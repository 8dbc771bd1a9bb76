"""The archive's `.ts` files (tsformer.data.ts_format) read by data=sequences: the same tensors as the
long-table copies, multivariate unequal-length files with missing padding, one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO
from tsformer.data.schema import DataValidationError
from tsformer.data.sequences import SequenceDataModule
from tsformer.data.ts_format import read_ts
from tsformer.settings import SettingError

ARCHIVE = REPO.parent / "shared" / "data" / "classification"
SETS = ["JapaneseVowels", "BasicMotions", "GunPoint", "ItalyPowerDemand", "OSULeaf", "ACSF1"]

TINY = """# a comment
#"a description line
@problemName Tiny
@timeStamps false
@missing true
@univariate false
@dimensions 2
@equalLength false
@classLabel true up down flat
@data
1,2,3:4,5,6:up
7,8,?,?:9,10,?,?:down

0.5,?,0.25:1,1,1:flat
"""


def write(tmp_path, text: str, name="Tiny_TRAIN.ts"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_multivariate_unequal_length_with_missing_padding(tmp_path):
    ts = read_ts(write(tmp_path, TINY.replace("0.5,?,0.25", "0.5,0.75,0.25")))
    assert ts.class_labels == ["up", "down", "flat"]
    assert list(ts.labels) == ["up", "down", "flat"]
    assert [x.shape for x in ts.x] == [(3, 2), (2, 2), (3, 2)]  # the trailing '?' padding is cut off
    np.testing.assert_array_equal(ts.x[1], [[7, 9], [8, 10]])
    assert list(ts.lines) == [11, 12, 14]


def test_missing_value_inside_a_series_names_file_and_line(tmp_path):
    path = write(tmp_path, TINY)
    with pytest.raises(DataValidationError, match=r"Tiny_TRAIN\.ts, line 14, dimension 0, step 1: missing"):
        read_ts(path)


@pytest.mark.parametrize(
    "line, message",
    [
        ("1,2,3:up", r"line 12: 1 dimension\(s\) separated by ':', the file has 2"),
        ("1,x,3:4,5,6:up", r"line 12, dimension 0: 'x' is not a number"),
        ("1,2,3:4,5,6:sideways", r"line 12: class label 'sideways' is not in the header's"),
        ("1,2,3:4,5:up", r"line 12: dimensions of different lengths \[3, 2\]"),
    ],
)
def test_a_malformed_line_is_one_error_naming_file_and_line(tmp_path, line, message):
    header = TINY.split("@data\n")[0] + "@data\n1,2,3:4,5,6:up\n"
    path = write(tmp_path, header + line + "\n")
    with pytest.raises(DataValidationError, match=message) as caught:
        read_ts(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_equal_length_file_refuses_another_length(tmp_path):
    text = (
        "@problemName E\n@univariate true\n@equalLength true\n@seriesLength 3\n@classLabel true a b\n@data\n"
    )
    path = write(tmp_path, text + "1,2,3:a\n1,2:b\n")
    with pytest.raises(DataValidationError, match=r"line 8: 2 values a dimension, @seriesLength is 3"):
        read_ts(path)


def test_timestamps_become_steps(tmp_path):
    text = "@problemName T\n@timeStamps true\n@univariate true\n@classLabel true a\n@data\n"
    ts = read_ts(write(tmp_path, text + "(0,1.5),(2,2.5),(5,3.5):a\n"))
    np.testing.assert_array_equal(ts.steps[0], [0, 2, 5])
    np.testing.assert_array_equal(ts.x[0][:, 0], [1.5, 2.5, 3.5])


def test_data_module_reads_ts_by_path_and_by_archive_name(tmp_path):
    rows = [f"{i},{i + 1},{i % 3}:{10 - i},{i},{i}:{'up' if i % 2 else 'down'}" for i in range(12)]
    text = TINY.split("@data\n")[0] + "@data\n" + "\n".join(rows) + "\n"
    (tmp_path / "Tiny").mkdir()
    write(tmp_path / "Tiny", text, "Tiny_TRAIN.ts")
    write(tmp_path / "Tiny", text, "Tiny_TEST.ts")
    by_name = SequenceDataModule(archive=tmp_path, name="Tiny", val_fraction=0.25)
    by_path = SequenceDataModule(str(tmp_path / "Tiny/Tiny_TRAIN.ts"), str(tmp_path / "Tiny/Tiny_TEST.ts"))
    by_path.val_fraction = 0.25
    for data in (by_name, by_path):
        data.setup()
        assert data.classes == ["down", "up"] and data.channel_names == ["ch0", "ch1"]
        assert len(data.datasets["test"]) == 12 and len(data.datasets["val"]) == 4
    np.testing.assert_array_equal(by_name.datasets["train"].samples[0], by_path.datasets["train"].samples[0])
    with pytest.raises(FileNotFoundError, match=r"data.archive=.* data.name=Nope"):
        SequenceDataModule(archive=tmp_path, name="Nope")
    with pytest.raises(SettingError, match="no training series"):
        SequenceDataModule()


@pytest.mark.needs_data(*(ARCHIVE / name for name in SETS))
@pytest.mark.parametrize("name", SETS)
def test_long_table_and_ts_give_the_same_tensors(name):
    long = SequenceDataModule(
        str(ARCHIVE / name / f"{name}_TRAIN_long.csv"), str(ARCHIVE / name / f"{name}_TEST_long.csv")
    )
    ts = SequenceDataModule(archive=ARCHIVE, name=name)
    long.setup()
    ts.setup()
    assert ts.classes == long.classes and ts.channel_names == long.channel_names
    for split in ("train", "val", "test"):
        a, b = long.datasets[split], ts.datasets[split]
        np.testing.assert_array_equal(a.labels, b.labels)
        assert len(a.samples) == len(b.samples)
        for x, y in zip(a.samples, b.samples, strict=True):
            np.testing.assert_array_equal(x, y)


def test_a_ts_file_as_its_long_table_reads_back_as_the_same_series(tmp_path):
    """`TsFile.long_table` (what a run logs of a .ts file to MLflow): the long-table route reads it as
    the .ts route reads the file."""
    rows = [f"{i},{i + 1},{i % 3}:{10 - i},{i},{i}:{'up' if i % 2 else 'down'}" for i in range(12)]
    path = write(tmp_path, TINY.split("@data\n")[0] + "@data\n" + "\n".join(rows) + "\n")
    table = read_ts(path).long_table()
    assert list(table.columns) == ["series_id", "step", "ch0", "ch1", "label"] and len(table) == 36
    table.to_csv(tmp_path / "long.csv", index=False)
    ts, long = (
        SequenceDataModule(str(path), str(path)),
        SequenceDataModule(str(tmp_path / "long.csv"), str(path)),
    )
    for data in (ts, long):
        data.val_fraction = 0.0
        data.setup()
    assert ts.classes == long.classes and ts.channel_names == long.channel_names
    for x, y in zip(ts.datasets["train"].samples, long.datasets["train"].samples, strict=True):
        np.testing.assert_array_equal(x, y)
