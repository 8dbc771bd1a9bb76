"""Download public benchmark data sets, checked against known sha256 hashes.

    tsformer-data fetch ett [--dest data/ETT-small] [--base-url URL] [--files ETTh1,ETTm1]
    python -m tsformer.data.fetch ett [same options]

Each file is downloaded to a temporary name in the destination folder, hashed while it arrives, and
renamed to its real name (atomically, `os.replace`) only when its sha256 is the expected one; a file
that does not match is deleted and reported with both hashes. A file already there with the right
hash is not downloaded again. Only the standard library is used (urllib).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tsformer.data import ett

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

    Every file is tried; if any failed, FetchError lists them all after the others are in place.
    """
    dest = Path(dest).expanduser().resolve()
    base_url = base_url if base_url.endswith("/") else base_url + "/"
    paths, errors = [], []
    for name in ett_files(files):
        url, path = base_url + name, dest / name
        try:
            downloaded = download(url, path, ett.SHA256[name])
        except FetchError as err:
            errors.append(str(err))
            echo(f"{name}: FAILED")
            continue
        echo(f"{name}: {'downloaded, sha256 ok' if downloaded else 'already there with the right sha256, skipped'}")
        paths.append(path)
    if errors:
        raise FetchError("\n".join(errors))
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
    "a file with another hash is refused (deleted). Then: python train.py experiment=ett/ETTh1_96_96"
)


def main(argv=None) -> int:
    """`python -m tsformer.data.fetch ett [options]`."""
    parser = argparse.ArgumentParser(
        prog="python -m tsformer.data.fetch", description=DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("dataset", choices=["ett"], help="the data set to download")
    _add_ett_arguments(parser)
    return _run(parser.parse_args(argv))


def cli(argv=None) -> int:
    """`tsformer-data fetch ett [options]` (the console script)."""
    parser = argparse.ArgumentParser(prog="tsformer-data", description="Benchmark data sets for tsformer.")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser(
        "fetch", help="download a data set", description=DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
    fetch.add_argument("dataset", choices=["ett"], help="the data set to download")
    _add_ett_arguments(fetch)
    return _run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
