"""`tsformer-data fetch ett` / `python -m tsformer.data.fetch ett` against a local HTTP server.

Nothing is downloaded from the internet: a server on 127.0.0.1 (port chosen by the system) serves
../shared/data (the real ETTh1 and ETTm1, tests skip without it) or a temporary folder.
"""

from __future__ import annotations

import functools
import http.server
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import REPO
from tsformer.data import ett, fetch
from tsformer.data.fetch import FetchError, fetch_ett, sha256_of

SHARED = REPO.parent / "shared" / "data"
needs_data = pytest.mark.needs_data(SHARED / "ETT-small")  # skipped where the folder is absent (conftest.py)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no request log on stderr
        pass


@pytest.fixture
def serve():
    """serve(folder) -> base URL of a local HTTP server for that folder; stopped after the test."""
    servers = []

    def start(folder: Path) -> str:
        handler = functools.partial(QuietHandler, directory=str(folder))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# -- the real files --------------------------------------------------------------------------------


@needs_data
def test_fetch_etth1_and_ettm1_then_skip_them(serve, tmp_path):
    base = serve(SHARED) + "/ETT-small/"
    dest = tmp_path / "data" / "ETT-small"
    lines = []
    paths = fetch_ett(dest, base, "ETTh1,ETTm1", echo=lines.append)
    assert [p.name for p in paths] == ["ETTh1.csv", "ETTm1.csv"]
    for path in paths:
        assert sha256_of(path) == ett.SHA256[path.name]
    assert leftovers(dest) == ["ETTh1.csv", "ETTm1.csv"]  # no temporary file left
    assert all("downloaded, sha256 ok" in line for line in lines)

    lines.clear()
    before = {p.name: p.stat().st_mtime_ns for p in paths}
    fetch_ett(dest, base, ["ETTh1", "ETTm1.csv"], echo=lines.append)
    assert all("skipped" in line for line in lines)
    assert {p.name: p.stat().st_mtime_ns for p in paths} == before  # not written again


@needs_data
def test_module_command_fetches_and_prints_the_licence(serve, tmp_path):
    base = serve(SHARED) + "/ETT-small/"
    proc = subprocess.run(
        [sys.executable, "-m", "tsformer.data.fetch", "ett", "--base-url", base, "--files", "ETTh1"],
        cwd=tmp_path,  # --dest defaults to data/ETT-small in the current folder
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    path = tmp_path / "data" / "ETT-small" / "ETTh1.csv"
    assert sha256_of(path) == ett.SHA256["ETTh1.csv"]
    assert str(path.parent) in proc.stdout
    assert "CC BY-ND 4.0" in proc.stdout and "Informer" in proc.stdout and "AAAI 2021" in proc.stdout


@needs_data
def test_corrupted_copy_is_refused_and_deleted(serve, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    data = bytearray((SHARED / "ETT-small" / "ETTh1.csv").read_bytes())
    data[-3] = ord("9") if data[-3] != ord("9") else ord("8")  # one digit of the last row changed
    (mirror / "ETTh1.csv").write_bytes(bytes(data))
    dest = tmp_path / "dest"
    with pytest.raises(FetchError) as err:
        fetch_ett(dest, serve(mirror) + "/", "ETTh1", echo=lambda line: None)
    message = str(err.value)
    assert "ETTh1.csv" in message and "sha256 mismatch" in message
    assert ett.SHA256["ETTh1.csv"] in message  # expected
    assert fetch.hashlib.sha256(bytes(data)).hexdigest() in message  # actual
    assert leftovers(dest) == []


# -- local only (always run) -----------------------------------------------------------------------


@pytest.fixture
def tiny_table(tmp_path, monkeypatch):
    """A served folder with a tiny ETTh1.csv, and the expected-hash table patched to its hash."""
    served = tmp_path / "served"
    served.mkdir()
    content = b"date,OT\n2016-07-01 00:00:00,1.0\n"
    (served / "ETTh1.csv").write_bytes(content)
    good = fetch.hashlib.sha256(content).hexdigest()
    monkeypatch.setitem(ett.SHA256, "ETTh1.csv", good)
    return served, content, good


def test_refusal_logic_with_a_tiny_file(serve, tmp_path, tiny_table, monkeypatch):
    served, content, good = tiny_table
    base = serve(served)  # no trailing slash: added
    dest = tmp_path / "dest"
    assert [p.name for p in fetch_ett(dest, base, "ETTh1", echo=lambda line: None)] == ["ETTh1.csv"]
    assert (dest / "ETTh1.csv").read_bytes() == content

    # the same bytes with another expected hash: refused, the download deleted, the old file untouched
    wrong = "0" * 64
    monkeypatch.setitem(ett.SHA256, "ETTh1.csv", wrong)
    (dest / "ETTh1.csv").write_bytes(b"an old copy\n")
    with pytest.raises(FetchError, match=f"expected {wrong}, got {good}"):
        fetch_ett(dest, base, "ETTh1", echo=lambda line: None)
    assert leftovers(dest) == ["ETTh1.csv"] and (dest / "ETTh1.csv").read_bytes() == b"an old copy\n"

    # a file there with another hash is replaced by a good download
    monkeypatch.setitem(ett.SHA256, "ETTh1.csv", good)
    fetch_ett(dest, base, "ETTh1", echo=lambda line: None)
    assert (dest / "ETTh1.csv").read_bytes() == content and leftovers(dest) == ["ETTh1.csv"]


def test_missing_file_names_the_url_and_the_others_still_arrive(serve, tmp_path, tiny_table):
    served, _, _ = tiny_table
    base = serve(served) + "/"
    dest = tmp_path / "dest"
    with pytest.raises(FetchError) as err:
        fetch_ett(dest, base, "ETTh2,ETTh1", echo=lambda line: None)
    assert f"{base}ETTh2.csv" in str(err.value) and "404" in str(err.value)
    assert leftovers(dest) == ["ETTh1.csv"]  # ETTh1 was fetched all the same; nothing of ETTh2


def test_unreachable_server_names_the_url(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    port = server.server_address[1]
    server.server_close()  # nothing listens on that port any more
    url = f"http://127.0.0.1:{port}/ETT-small/"
    with pytest.raises(FetchError, match=f"cannot download {url}ETTm2.csv"):
        fetch_ett(tmp_path / "dest", url, "ETTm2", echo=lambda line: None)
    assert leftovers(tmp_path / "dest") == []


def test_failed_fetch_leaves_no_folder_and_names_the_other_ways(tmp_path, capsys, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    port = server.server_address[1]
    server.server_close()  # nothing listens on that port any more
    dest = tmp_path / "data" / "ETT-small"
    base = f"http://127.0.0.1:{port}/"
    assert fetch.cli(["fetch", "ett", "--base-url", base, "--dest", str(dest), "--files", "ETTh1,ETTm1"]) == 1
    assert not (tmp_path / "data").exists()  # nothing that the next command would take for the data
    error = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(error) == 1, error
    for part in ["ETTh1.csv, ETTm1.csv", "--base-url", ett.SOURCE_URL, "by hand", str(dest)]:
        assert part in error[0]
    # the next command, a run on that folder, gives the same ways, not only the fetch that failed
    monkeypatch.setattr(ett, "fallback_folders", list)  # no shared copy to fall back on
    with pytest.raises(FileNotFoundError) as err:
        ett.load_ett(dest, "ETTh1")
    assert "--base-url" in str(err.value) and ett.SOURCE_URL in str(err.value)


def test_failed_fetch_keeps_a_folder_that_was_there(tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    missing = (tmp_path / "no-such-mirror").as_uri()  # a file:// URL that does not exist
    with pytest.raises(FetchError, match="ETTh2.csv"):
        fetch_ett(dest, missing, "ETTh2", echo=lambda line: None)
    assert dest.is_dir() and leftovers(dest) == []


def test_git_lfs_pointer_is_explained(serve, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "ETTm1.csv").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 10\n")
    with pytest.raises(FetchError, match="Git LFS pointer"):
        fetch_ett(tmp_path / "dest", serve(served), "ETTm1", echo=lambda line: None)


def test_cli_exit_status_and_messages(serve, tmp_path, tiny_table, capsys):
    served, _, _ = tiny_table
    base = serve(served)
    dest = tmp_path / "dest"
    assert fetch.cli(["fetch", "ett", "--base-url", base, "--dest", str(dest), "--files", "ETTh1"]) == 0
    out = capsys.readouterr().out
    assert str(dest) in out and "CC BY-ND 4.0" in out
    assert fetch.main(["ett", "--base-url", base, "--dest", str(dest), "--files", "ETTh2"]) == 1
    assert f"{base}/ETTh2.csv" in capsys.readouterr().err
    with pytest.raises(FetchError, match="unknown ETT file 'ETTh3'"):
        fetch.ett_files("ETTh1,ETTh3")
    with pytest.raises(SystemExit):
        fetch.cli(["fetch", "ett", "--help"])
    help_text = capsys.readouterr().out
    assert ett.BASE_URL in help_text and "Git LFS" in help_text


def test_console_script_is_declared():
    # (no tomllib: the project supports Python 3.10)
    scripts = (REPO / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    assert 'tsformer-data = "tsformer.data.fetch:cli"' in scripts


def test_fetch_starts_without_torch_or_lightning():
    # the download command imports tsformer.data, whose DataModule would pull in torch and Lightning (seconds)
    code = "import sys, tsformer.data.fetch; print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_name_of_the_data_package_loads():
    import tsformer.data

    for name in tsformer.data.__all__:
        assert getattr(tsformer.data, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tsformer.data.nope  # noqa: B018
