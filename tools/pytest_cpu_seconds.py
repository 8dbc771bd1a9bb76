"""Per-test CPU seconds (self + children), setup/call/teardown; written to $CPUPLUG_OUT as TSV."""

import os
import resource

import pytest

_rows = []


def _cpu():
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


def _wrap(item, phase):
    a = _cpu()
    yield
    b = _cpu()
    _rows.append((item.nodeid, phase, b[0] - a[0], b[1] - a[1]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _wrap(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _wrap(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _wrap(item, "teardown")


_start = None


def pytest_sessionstart(session):
    global _start
    _start = _cpu()


def pytest_sessionfinish(session):
    out = os.environ.get("CPUPLUG_OUT")
    end = _cpu()
    if not out:
        return
    with open(out, "w") as f:
        f.write(f"#session\t{end[0] - _start[0]:.2f}\t{end[1] - _start[1]:.2f}\n")
        f.writelines(f"{r[0]}\t{r[1]}\t{r[2]:.2f}\t{r[3]:.2f}\n" for r in _rows)
