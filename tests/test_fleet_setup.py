"""tsformer-fleet where Spark cannot run: pyspark or Java missing, a bad Spark setting. One line, exit 2,
before any session starts (these run with or without pyspark installed)."""

from __future__ import annotations

import sys
import types

from tsformer.serving import fleet


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
