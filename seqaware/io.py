"""Small file-system helpers: everything a user produced is written atomically.

A file is first written next to its destination under a temporary name and then moved into place
with :func:`os.replace`, which is atomic on POSIX file systems. An interrupted run therefore leaves
either the old file or the new one, never a truncated mix. Cache folders (a generated or
converted dataset) are built the same way, as a whole: :func:`build_folder_once`.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on a clean exit move it onto ``path``.

    On an exception the temporary file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    binary = "b" in mode
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
    try:
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> int:
    """Write ``records`` as JSON lines atomically; returns the number of lines written."""
    count = 0
    with atomic_open(path, "w") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


TEST_METRICS_MARKER = "TEST_METRICS_JSON "
"""Prefix of the line in which ``train.py`` prints its test metrics as JSON (read back by scripts)."""


def format_test_metrics(metrics: dict) -> str:
    """The ``TEST_METRICS_JSON {...}`` line ``train.py`` prints after testing."""
    return TEST_METRICS_MARKER + json.dumps(metrics, sort_keys=True)


def parse_test_metrics(text: str) -> dict | None:
    """The metrics of the last ``TEST_METRICS_JSON`` line in ``text`` (a run's output); None without one.

    A malformed line raises :class:`json.JSONDecodeError`.
    """
    for line in reversed(text.splitlines()):
        if line.startswith(TEST_METRICS_MARKER):
            return json.loads(line[len(TEST_METRICS_MARKER):])
    return None


TEST_METRICS_FILE = "test_metrics.json"
"""The file in a run folder holding the numbers of the run's ``TEST_METRICS_JSON`` line."""


def write_test_metrics(run_dir: str | os.PathLike, metrics: dict) -> Path:
    """Write ``<run_dir>/test_metrics.json`` atomically: the JSON of :func:`format_test_metrics`."""
    path = Path(run_dir) / TEST_METRICS_FILE
    with atomic_open(path) as handle:
        handle.write(format_test_metrics(metrics)[len(TEST_METRICS_MARKER):] + "\n")
    return path


def read_test_metrics(run_dir: str | os.PathLike) -> dict | None:
    """The metrics of ``<run_dir>/test_metrics.json`` (None when the run has not been tested)."""
    path = Path(run_dir) / TEST_METRICS_FILE
    if not path.is_file():
        return None
    return parse_test_metrics(TEST_METRICS_MARKER + path.read_text().strip())


DONE_MARKER = "DONE"
"""The file a cache folder receives last; a folder without it is never trusted."""


def build_folder_once(cache_dir: str | os.PathLike, key: str, build: Callable[[Path], None]) -> Path:
    """The folder ``cache_dir/key``, built by ``build(folder)`` unless a complete one is there.

    ``build`` writes into a temporary folder beside the final one, which gets a ``DONE`` marker
    last and is then renamed into place, so an interrupted or concurrent run never leaves a folder
    under the final name that looks complete without being so. When two runs race, the first
    rename wins and the other run discards its copy. A folder under the final name without the
    marker (not written by this function) is set aside and replaced.
    """
    cache_dir = Path(cache_dir)
    folder = cache_dir / key
    if (folder / DONE_MARKER).is_file():
        return folder
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=cache_dir))
    tmp.chmod(0o755)  # mkdtemp makes it private; the finished folder is readable like any other
    try:
        build(tmp)
        (tmp / DONE_MARKER).write_text(key + "\n")
        for _ in range(3):
            if (folder / DONE_MARKER).is_file():
                return folder  # another run finished first
            try:
                os.rename(tmp, folder)
                return folder
            except OSError:
                if folder.exists() and not (folder / DONE_MARKER).is_file():
                    stale = cache_dir / f".{key}.stale-{uuid.uuid4().hex}"
                    with contextlib.suppress(OSError):
                        os.rename(folder, stale)
                    shutil.rmtree(stale, ignore_errors=True)
        raise RuntimeError(f"could not move the finished cache folder into {folder}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
