"""tsformer-fleet where Spark cannot run: pyspark or Java missing, a bad Spark setting, a local DATA that is
not Parquet. One line, exit 2, before any session starts (these run with or without pyspark installed)."""

from __future__ import annotations

import sys
import types

import pandas as pd
import pytest

from tsformer.data.schema import DataValidationError
from tsformer.serving import fleet
from tsformer.serving.spark import check_local_table


def run_fleet(capsys, tmp_path) -> tuple[int, list[str]]:
    status = fleet.main(["model", "data.parquet", "--output", str(tmp_path / "answers")])
    return status, capsys.readouterr().err.strip().splitlines()


def test_without_pyspark_the_command_says_what_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "pyspark", None)  # `import pyspark` raises ImportError
    status, err = run_fleet(capsys, tmp_path)
    assert status == 2 and len(err) == 1, err
    assert err[0].startswith("error: pyspark is not installed") and "tsformer[spark]" in err[0]
    assert not (tmp_path / "answers").exists()


def test_without_java_the_command_says_what_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "pyspark", types.ModuleType("pyspark"))  # installed or not here
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on it
    monkeypatch.delenv("JAVA_HOME", raising=False)
    status, err = run_fleet(capsys, tmp_path)
    assert status == 2 and len(err) == 1, err
    assert err[0].startswith("error: no Java runtime: Spark needs Java 17 or 21")


def test_a_spark_setting_without_a_value_is_one_line(capsys, tmp_path):
    status = fleet.main(
        ["model", "data.parquet", "-o", str(tmp_path / "a"), "--conf", "spark.executor.memory"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err == [
        "error: --conf 'spark.executor.memory': give KEY=VALUE, e.g. spark.executor.memory=4g"
    ]


def test_a_file_of_a_parquet_folder_that_is_not_parquet_is_named_before_spark_reads_it(tmp_path):
    """Spark reads every file of the folder but its hidden ones; one that is not Parquet is named (Spark
    said only `An error occurred while calling o35.parquet.`)."""
    pd.DataFrame({"series_id": [1], "x": [0.5]}).to_parquet(tmp_path / "part-0.parquet")
    (tmp_path / "_SUCCESS").write_text("")  # Spark's own files: not read
    (tmp_path / ".part-0.parquet.crc").write_text("checksum")
    check_local_table(tmp_path)
    (tmp_path / "part-1").write_text("series_id,x\n1,0.5\n")
    with pytest.raises(DataValidationError, match=r"part-1: cannot be read as Parquet \(.*magic bytes"):
        check_local_table(tmp_path)
