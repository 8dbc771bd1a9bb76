"""The `tsformer-data` command: download public benchmark data sets, checked against known sha256
hashes, and write the simulated data sets as tables.

    tsformer-data fetch ett [--dest data/ETT-small] [--base-url URL] [--files ETTh1,ETTm1]
    python -m tsformer.data.fetch ett [same options]
    tsformer-data simulate plant|wind|sensor|plant_regime|plant_anomaly --output plant.csv
        [--n-steps 6000 --seed 0 ...] [--future-steps N]

Each file is downloaded to a temporary name in the destination folder, hashed while it arrives, and
renamed to its real name (atomically, `os.replace`) only when its sha256 is the expected one; a file
that does not match is deleted and reported with both hashes. A file already there with the right
hash is not downloaded again. Only the standard library is used (urllib).

`simulate` writes what `data=<name>` trains on (conf/data/<name>.yaml: its simulator settings are
the defaults of the options), with the columns that config uses, as a table that `data=csv` reads (CSV
or Parquet, as the `--output` name says: `plant.csv`, `fleet.parquet`);
`--future-steps N` empties the targets of each series' last N rows, the layout `predict.py` reads.
A labelled stream (`plant_regime`) is written with its label column, as `predict.py` classifies it;
the plant with injected faults (`plant_anomaly`) with its channels and labels, as `predict.py` judges it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import os
import shlex
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tsformer.config import command_line, config_dir
from tsformer.data import ett, simulators
from tsformer.data.sources import READERS

CHUNK = 1 << 20  # bytes read at a time
TIMEOUT_S = 60  # per network operation (connect, each read), not for the whole file
LFS_POINTER = b"version https://git-lfs"


class FetchError(RuntimeError):
    """A file could not be fetched (network, HTTP status, wrong hash); the message names it."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download(url: str, path: Path, sha256: str, timeout: float = TIMEOUT_S) -> bool:
    """`url` -> `path` if its sha256 is `sha256`. Returns False when `path` already had that hash
    (nothing downloaded), True after a download. Raises FetchError, leaving no partial file."""
    path = Path(path)
    if path.is_file() and sha256_of(path) == sha256:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        head = b""
        with os.fdopen(fd, "wb") as out:
            request = urllib.request.Request(url, headers={"User-Agent": "tsformer-data-fetch"})
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    for chunk in iter(lambda: response.read(CHUNK), b""):
                        if len(head) < len(LFS_POINTER):
                            head += chunk[: len(LFS_POINTER)]
                        digest.update(chunk)
                        out.write(chunk)
            except urllib.error.HTTPError as err:
                raise FetchError(f"{path.name}: {url} answered HTTP {err.code} {err.reason}") from err
            except urllib.error.URLError as err:
                raise FetchError(f"{path.name}: cannot download {url}: {err.reason}") from err
            except OSError as err:  # timeouts, connections reset mid-file
                raise FetchError(f"{path.name}: download of {url} failed: {err}") from err
        actual = digest.hexdigest()
        if actual != sha256:
            hint = ""
            if head.startswith(LFS_POINTER):
                hint = (
                    " The server sent a Git LFS pointer, not the file: use a mirror that serves the file "
                    "itself (--base-url)."
                )
            raise FetchError(
                f"{path.name}: sha256 mismatch for {url}: expected {sha256}, got {actual}; "
                f"the download was deleted, nothing was written to {path}.{hint}"
            )
        mask = os.umask(0)  # mkstemp creates the file 0600; give it the permissions of any new file
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)  # atomic on one file system: the real name only ever holds a good file
        return True
    finally:
        tmp.unlink(missing_ok=True)


def ett_files(files) -> list[str]:
    """'ETTh1,ETTm1' or ['ETTh1', 'ETTm1.csv'] -> ['ETTh1.csv', 'ETTm1.csv']; None -> all four."""
    if files is None:
        return list(ett.SHA256)
    if isinstance(files, str):
        files = files.split(",")
    names = []
    for f in (str(f).strip() for f in files):
        name = f if f.endswith(".csv") else f"{f}.csv"
        if name not in ett.SHA256:
            raise FetchError(f"unknown ETT file {f!r}; choose from {', '.join(n[:-4] for n in ett.SHA256)}")
        names.append(name)
    return names


def fetch_ett(dest="data/ETT-small", base_url: str = ett.BASE_URL, files=None, echo=print) -> list[Path]:
    """Download the ETT files into `dest` (see the module docstring); returns their paths.

    Every file is tried; if any failed, FetchError lists them all after the others are in place,
    with the other ways to get them. Folders this call created and left empty are removed, so that
    a failed fetch leaves nothing that looks like data.
    """
    dest = Path(dest).expanduser().resolve()
    created = [folder for folder in [dest, *dest.parents] if not folder.exists()]
    base_url = base_url if base_url.endswith("/") else base_url + "/"
    paths, errors, failed = [], [], []
    for name in ett_files(files):
        url, path = base_url + name, dest / name
        try:
            downloaded = download(url, path, ett.SHA256[name])
        except FetchError as err:
            errors.append(str(err))
            failed.append(name)
            echo(f"{name}: FAILED")
            continue
        echo(
            f"{name}: {'downloaded, sha256 ok' if downloaded else 'already there with the right sha256, skipped'}"
        )
        paths.append(path)
    if errors:
        for folder in created:  # deepest first
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        reasons = "; ".join(e.rstrip(".") for e in errors)
        raise FetchError(
            f"{reasons}. Get {', '.join(failed)} another way: from a mirror that serves the unmodified "
            f"files (--base-url URL; the sha256 check stays), or download them by hand from "
            f"{ett.SOURCE_URL} and copy them into {dest}"
        )
    return paths


def _add_ett_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dest",
        default="data/ETT-small",
        help="folder the files go to (default: data/ETT-small in the current folder,\n"
        "the first place conf/data/ett.yaml looks in)",
    )
    parser.add_argument(
        "--base-url",
        default=ett.BASE_URL,
        help="URL of the folder holding the files; default, the ETDataset repository's ETT-small/:\n"
        f"  {ett.BASE_URL}\n"
        "Upstream, ETTm1.csv and ETTm2.csv may be stored with Git LFS or be too large for\n"
        "some mirrors (the hash check then fails and says so): point this at any mirror or\n"
        "local server that holds the unmodified files; the sha256 check stays the same.",
    )
    parser.add_argument(
        "--files",
        default=None,
        help="comma-separated subset of ETTh1,ETTh2,ETTm1,ETTm2 (default: all four)",
    )


def _run(args: argparse.Namespace) -> int:
    try:
        paths = fetch_ett(args.dest, args.base_url, args.files)
    except FetchError as err:
        print(f"error: {err}", file=sys.stderr)
        print(ett.LICENCE_NOTE)
        return 1
    print(f"ETT files in {Path(args.dest).expanduser().resolve()}: {', '.join(p.name for p in paths)}")
    print(ett.LICENCE_NOTE)
    return 0


DESCRIPTION = (
    "Download the ETT benchmark files (ETTh1, ETTh2, ETTm1, ETTm2) and check their sha256;\n"
    "a file with another hash is refused (deleted). Then: python train.py experiment=ett data.name=ETTh1"
)


def main(argv=None) -> int:
    """`python -m tsformer.data.fetch ett [options]`."""
    parser = argparse.ArgumentParser(
        prog="python -m tsformer.data.fetch",
        description=DESCRIPTION,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument("dataset", choices=["ett"], help="the data set to download")
    _add_ett_arguments(parser)
    return _run(parser.parse_args(argv))


DATA_CONFIGS = config_dir() / "data"
# the modules whose simulators `data=<name>` configs name (the plant with faults is anomaly detection's)
SIMULATOR_MODULES = ("tsformer.data.simulators", "tsformer.data.plant_anomaly")


def simulated_data_configs() -> dict[str, dict]:
    """conf/data/<name>.yaml of each simulated data set, a plain dict (no Hydra: the command stays light)."""
    from omegaconf import OmegaConf

    configs = {}
    for path in sorted(DATA_CONFIGS.glob("*.yaml")):
        config = OmegaConf.to_container(OmegaConf.load(path))
        source = config.get("source")
        if (
            isinstance(source, dict)
            and str(source.get("_target_", "")).rpartition(".")[0] in SIMULATOR_MODULES
        ):
            configs[path.stem] = config
    return configs


def _simulator(config: dict):
    module, _, name = config["source"]["_target_"].rpartition(".")
    return getattr(importlib.import_module(module), name)


def simulator_settings(config: dict) -> dict:
    """The simulator's settings as `data=<name>` uses them: the config's, else the function's defaults."""
    settings = {name: p.default for name, p in inspect.signature(_simulator(config)).parameters.items()}
    settings.update({k: v for k, v in config["source"].items() if k in settings})
    return settings


def simulated_table(config: dict, settings: dict, future_steps: int = 0) -> tuple:
    """(table, target columns): the simulated data of `config` with the columns it uses; the target
    cells of each series' last `future_steps` rows are empty (the rows a forecast fills in). A labelled
    stream (`data=plant_regime`) has its label as the target: the channels and one label per step."""
    table = _simulator(config)(**settings)
    targets = list(config.get("target_cols") or [config["label_col"]])
    roles = ("known_cols", "observed_cols", "channel_cols")
    used = {*targets, *(c for role in roles for c in config.get(role) or []), config.get("label_col")}
    table = table[[c for c in table.columns if c in ("series_id", "time") or c in used]]
    if future_steps:
        future = table.groupby("series_id").cumcount(ascending=False) < future_steps
        table = table.astype({c: float for c in targets})
        table.loc[future, targets] = float("nan")
    return table, targets


# the options of `simulate`: the plant's simulator's settings (the others take some of them)
SIMULATOR_OPTIONS = dict(inspect.signature(simulators.simulate_plant).parameters)


def _option(setting: str) -> str:
    return f"--{setting.replace('_', '-')}"


def _refuse(message: str) -> int:
    """A bad option: one line, exit status 2, nothing written."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def simulate_command(data: dict, future_steps: int, min_steps: int) -> str | None:
    """The `tsformer-data simulate` command, runnable from any folder, that writes a new table of the
    simulated data set `data` (a run's data config, resolved) trained on: its simulator's settings, another
    seed, at least `min_steps` rows per series, the target cells of each series' last `future_steps` rows
    empty; None when `data` is not a simulated data set's."""
    configs = simulated_data_configs()
    name, source = data.get("name"), data.get("source") or {}
    if name not in configs or source.get("_target_") != configs[name]["source"]["_target_"]:
        return None
    own = simulator_settings(configs[name])
    used = {k: v for k, v in source.items() if k in SIMULATOR_OPTIONS}
    options = {"seed": int(used.get("seed", own["seed"])) + 1, "n_steps": max(200, 2 * min_steps)}
    options |= {k: v for k, v in used.items() if k not in ("seed", "n_steps", "n_series") and v != own.get(k)}
    args = [f"{_option(k)} {shlex.quote(str(v))}" for k, v in options.items()]
    args += [f"--future-steps {future_steps}"] if future_steps else []
    script = Path(sys.executable).parent / "tsformer-data"  # the console script beside the interpreter
    runs = shlex.quote(os.path.abspath(script)) if script.is_file() else "tsformer-data"
    return " ".join([runs, "simulate", name, *args, "--output new.csv"])


def _add_simulate_arguments(parser: argparse.ArgumentParser, configs: dict) -> None:
    parser.add_argument(
        "dataset", choices=sorted(configs), help="the simulated data set (conf/data/<name>.yaml)"
    )
    parser.add_argument(
        "--output", "-o", required=True, help="the table to write: a .csv or .parquet file (by its name)"
    )
    parser.add_argument(
        "--future-steps",
        type=int,
        default=0,
        help="leave the target cells of each series' last N rows empty: history, then N future rows\n"
        "with the known covariates only, as predict.py reads them (N >= the model's horizon)",
    )
    # the simulators share their settings (n_series, n_steps, freq, start, seed); the plant has more
    for name, setting in SIMULATOR_OPTIONS.items():
        parser.add_argument(
            _option(name),
            type=type(setting.default),
            default=None,
            help=f"the simulator's {name} (default: as data=<name> trains on it)",
        )


def _run_simulate(args: argparse.Namespace, configs: dict) -> int:
    config = configs[args.dataset]
    settings = simulator_settings(config)
    problem = _simulate_problem(args, config, settings)
    if problem:
        return _refuse(problem)
    settings.update({k: v for k, v in vars(args).items() if k in SIMULATOR_OPTIONS and v is not None})
    try:
        table, targets = simulated_table(config, settings, args.future_steps)
    except ValueError as err:  # settings the simulator refuses (a table too short for its faults)
        return _refuse(f"{args.dataset}: {err}")
    path = Path(args.output).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".csv":
        table.to_csv(path, index=False)
    else:  # Parquet (`_simulate_problem` refused another suffix): its types kept
        table.to_parquet(path, index=False)
    print(
        f"{path.resolve()}: {args.dataset}, {table['series_id'].nunique()} series x {settings['n_steps']} steps "
        f"of {settings['freq']} (seed {settings['seed']}), columns {', '.join(table.columns)}"
    )
    print(_what_next(args, config, table, targets, path))
    return 0


def _simulate_problem(args: argparse.Namespace, config: dict, settings: dict) -> str:
    """What is wrong with the options of `simulate` ("" when nothing): a setting the data set's
    simulator does not take, future steps of a labelled table, or as many as its rows."""
    given = {k for k, v in vars(args).items() if k in SIMULATOR_OPTIONS and v is not None}
    if unknown := sorted(given - set(settings)):
        takes = ", ".join(_option(k) for k in settings if k in SIMULATOR_OPTIONS)
        return (
            f"{', '.join(_option(k) for k in unknown)}: not a setting of {args.dataset}'s simulator "
            f"({config['source']['_target_']}); its settings: {takes}"
        )
    if config.get("label_col") and args.future_steps:
        what = "anomaly detection" if config.get("target_cols") else "classification"
        return (
            f"--future-steps: {args.dataset} is a labelled table for {what} (a label per step), "
            f"not a forecast's data; leave --future-steps out"
        )
    suffix = Path(args.output).suffix
    if suffix.lower() not in READERS:
        return (
            f"--output {args.output}: a {suffix or 'file without a'} suffix; name a .csv or .parquet file "
            "(the tables predict.py and data=csv read)"
        )
    n_steps = getattr(args, "n_steps", None) or settings["n_steps"]
    if not 0 <= args.future_steps < n_steps:
        return (
            f"--future-steps {args.future_steps} must be at least 0 and below --n-steps {n_steps} (the "
            "rows before them are the history)"
        )
    return ""


def _what_next(args: argparse.Namespace, config: dict, table, targets: list[str], path: Path) -> str:
    """The line after the table's: the command that uses it (predict.py, or train.py on it)."""
    at = shlex.quote(str(path.resolve()))
    if not config.get("target_cols"):  # a classification stream: a label per step, no forecast
        channels = ",".join(config["channel_cols"])
        return (
            f"classify it with a model trained on data={args.dataset}: "
            f"{command_line('predict', '<run id>', at, '--output classes.csv')}\n"
            f"or train on it: {command_line('train', 'model=enc_only_classifier data=stream')} "
            f"data.source={at} data.series_col=series_id data.channel_cols=[{channels}] "
            f"data.label_col={targets[0]}"
        )
    if config.get("label_col"):  # channels with labelled faults: anomaly detection's table
        return (
            f"judge it with a model trained on data={args.dataset}: "
            f"{command_line('predict', '<run id>', at, '--output anomalies.csv')}"
        )
    if args.future_steps:
        return (
            f"the targets ({', '.join(targets)}) of each series' last {args.future_steps} rows are empty; "
            f"forecast them: {command_line('predict', '<run id>', at, '--output forecasts.csv')}"
        )
    known = [c for c in table.columns if c not in ("series_id", "time", *targets)]
    return (
        f"train on it: {command_line('train', f'data=csv data.source={at}')} data.series_col=series_id "
        f"data.target_cols=[{','.join(targets)}] data.known_cols=[{','.join(known)}]"
    )


def cli(argv=None) -> int:
    """`tsformer-data fetch ett [options]`, `tsformer-data simulate <name> [options]` (the console script)."""
    parser = argparse.ArgumentParser(prog="tsformer-data", description="Data sets for tsformer.")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser(
        "fetch",
        help="download a data set",
        description=DESCRIPTION,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    fetch.add_argument("dataset", choices=["ett"], help="the data set to download")
    _add_ett_arguments(fetch)
    configs = simulated_data_configs()
    simulate = commands.add_parser(
        "simulate",
        help="write a simulated data set as a CSV or Parquet table",
        description="Write a simulated data set (the one data=<name> trains on) as a CSV or Parquet\n"
        "table (by the --output name) that data=csv reads; with --future-steps, a table to forecast\n"
        "with predict.py.",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    _add_simulate_arguments(simulate, configs)
    args = parser.parse_args(argv)
    return _run(args) if args.command == "fetch" else _run_simulate(args, configs)


if __name__ == "__main__":
    sys.exit(main())
