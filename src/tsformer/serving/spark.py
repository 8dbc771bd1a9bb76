"""What the fleet (`serving/fleet.py`) needs of Spark: a session, a table read with each row's place in
its file, a model folder shipped to the executors, and an output folder written atomically.

pyspark is an optional dependency (`pip install 'tsformer[spark]'`) and needs a Java runtime (17 or 21):
`require_spark` says in one line which is missing. This module imports pyspark only inside functions.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

DEFAULT_MASTER = "local[*]"
# each row's file and position in it, added when the table is read: a series' rows in file order
FILE_COL, ROW_COL = "_tsformer_file", "_tsformer_row"
# Arrow between the JVM and pandas: applyInPandas uses it always, the driver's toPandas too with this
ARROW = {"spark.sql.execution.arrow.pyspark.enabled": "true"}
# a session the fleet starts: also times as they are written (no conversion to the machine's zone)
SESSION_SETTINGS = {"spark.sql.session.timeZone": "UTC", **ARROW}


class SparkUnavailable(Exception):
    """pyspark or Java missing, or the session does not start: one line."""


def require_spark() -> None:
    """pyspark importable and a Java runtime found, or one line saying what to install."""
    require_pyspark()
    require_java()


def require_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError as err:
        raise SparkUnavailable(
            "pyspark is not installed: the fleet runs on Spark; pip install 'tsformer[spark]' (or pip "
            "install pyspark)"
        ) from err


def require_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and Path(java_home, "bin", "java").is_file()) and shutil.which("java") is None:
        raise SparkUnavailable(
            "no Java runtime: Spark needs Java 17 or 21 (e.g. apt-get install openjdk-17-jre-headless); "
            "put java on PATH or set JAVA_HOME"
        )


def spark_session(master: str | None = None, conf: dict[str, str] | None = None):
    """The running Spark session (under spark-submit: its master), else a new one on `master` (default
    `$SPARK_MASTER`, else local[*]) whose JVM logs errors only and draws no progress bar. Python
    workers run this interpreter unless PYSPARK_PYTHON says otherwise (else they start `python3` from
    PATH, which may not have the packages)."""
    require_spark()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("tsformer-fleet")
    master = master or os.environ.get("SPARK_MASTER")
    settings = dict(SESSION_SETTINGS)
    try:
        if SparkSession.getActiveSession() is None and not SparkConf().contains("spark.master"):
            # not under spark-submit: this process starts the driver's JVM
            master = master or DEFAULT_MASTER
            settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={_log_config()}"
            settings["spark.ui.showConsoleProgress"] = "false"
        if master:
            builder = builder.master(master)
        for key, value in {**settings, **(conf or {})}.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
    except Exception as err:  # the JVM did not start (pyspark's own message is a page)
        raise SparkUnavailable(f"Spark did not start (master {master}): {first_line(err)}") from err


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# The driver JVM's log: errors only (Spark's default prints its settings and warnings at start; to
# Spark, a Python driver is a REPL, whose logger's level becomes the root's). A failed task is not
# logged: its error reaches the driver, which prints one line (four loggers would repeat its trace).
LOG4J2 = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.repl.name = org.apache.spark.api.python.PythonGatewayServer
logger.repl.level = error
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = off
logger.writer.name = org.apache.spark.sql.execution.datasources.FileFormatWriter
logger.writer.level = off
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = off
"""


def _log_config() -> Path:
    return _staged_text(Path(tempfile.gettempdir()) / "tsformer-fleet" / "log4j2.properties", LOG4J2)


def _staged_text(path: Path, text: str) -> Path:
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def is_local(path: str) -> bool:
    return "://" not in path


def read_table(spark, data: str, csv: dict):
    """DATA as a Spark DataFrame with each row's file and position (`FILE_COL`, `ROW_COL`): a .csv file
    read as text cells (pandas reads them as predict.py does, `csv`: its sep, decimal, encoding; a
    malformed row fails the read, none is dropped), else Parquet (a file or a folder of files)."""
    from pyspark.sql import functions as F

    if is_local(data):
        check_local_table(Path(data).expanduser())
    path = str(Path(data).expanduser().resolve()) if is_local(data) else data
    if is_csv(data):
        reader = spark.read.options(
            header=True, inferSchema=False, mode="FAILFAST", quote='"', escape='"',
            sep=csv.get("sep", ","), encoding=csv.get("encoding", "utf-8"),
        )  # fmt: skip
        frame = reader.csv(path)
    else:
        frame = spark.read.parquet(path)
    # the position is increasing within a file (Spark reads a file's splits in order)
    return frame.select(
        "*", F.col("_metadata.file_path").alias(FILE_COL), F.monotonically_increasing_id().alias(ROW_COL)
    )


def check_local_table(path: Path) -> None:
    """A local DATA that Spark can read, or predict.py's line for it (rather than Spark's Java message):
    a file of a type predict.py reads; a Parquet file's, or each Parquet file of a folder's, footer read."""
    from tsformer.data.sources import check_parquet_footer, reader_of

    if not path.exists():
        raise FileNotFoundError(f"data not found: {path} (resolved to {path.resolve()})")
    if path.is_file():
        reader_of(path)  # a type predict.py reads
        if not is_csv(path.name):
            check_parquet_footer(path)
        return
    for file in sorted(path.rglob("*")):  # the files Spark reads: none hidden ("_SUCCESS", ".crc")
        if file.is_file() and not any(part.startswith(("_", ".")) for part in file.relative_to(path).parts):
            check_parquet_footer(file)


def is_csv(data: str) -> bool:
    return data.lower().endswith(".csv")


def ship_folder(spark, folder: Path, prefix: str) -> str:
    """`folder` copied to one named after its contents (`<prefix>-<digest>`) and added to the
    session's files (`SparkContext.addFile`): the name executors find it by (`SparkFiles.get`). A
    folder shipped again (the same contents) is not added twice."""
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(folder)).encode() + b"\0" + file.read_bytes())
    name = f"{prefix}-{digest.hexdigest()[:16]}"
    staged = Path(tempfile.gettempdir()) / "tsformer-fleet" / name
    if not staged.is_dir():
        tmp = staged.with_name(f"{name}.{uuid.uuid4().hex}.partial")
        shutil.copytree(folder, tmp)
        try:
            os.replace(tmp, staged)
        except OSError:  # another process staged the same folder meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    sc = spark.sparkContext
    if not any(uri.rstrip("/").endswith(f"/{name}") for uri in sc.listFiles):
        sc.addFile(str(staged), recursive=True)
    return name


class OutputFolder:
    """An output folder written through Hadoop's file system API (a local path or any URI the cluster
    writes: hdfs://, s3a://): the job writes a temporary folder beside it (`tmp_uri`), renamed when
    complete; a failed job's temporary folder is deleted."""

    def __init__(self, spark, output: str):
        sc = spark.sparkContext
        hadoop_path = sc._jvm.org.apache.hadoop.fs.Path
        self.shown = output
        self.uri = Path(output).expanduser().resolve().as_uri() if is_local(output) else output
        self.tmp_uri = f"{self.uri.rstrip('/')}.partial-{uuid.uuid4().hex[:12]}"
        self.path, self.tmp = hadoop_path(self.uri), hadoop_path(self.tmp_uri)
        self.fs = self.path.getFileSystem(sc._jsc.hadoopConfiguration())

    def exists(self) -> bool:
        return bool(self.fs.exists(self.path))

    def commit(self, overwrite: bool) -> None:
        """The complete temporary folder becomes the output (an existing one replaced with `overwrite`)."""
        if overwrite and self.exists():
            self.fs.delete(self.path, True)
        if not self.fs.rename(self.tmp, self.path):
            raise OSError(f"{self.shown}: the answers could not be moved there from {self.tmp_uri}")

    def discard(self) -> None:
        self.fs.delete(self.tmp, True)


def spark_schema(frame):
    """The Spark schema of a pandas frame, through Arrow (times without a zone as TIMESTAMP_NTZ; a
    column holding no value: text)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = pa.Schema.from_pandas(frame, preserve_index=False)
    fields = [pa.field(f.name, pa.string()) if pa.types.is_null(f.type) else f for f in schema]
    return from_arrow_schema(pa.schema(fields), prefer_timestamp_ntz=True)
