"""Shared helpers of the kompress Python tests (run by ctest: python/tests/python_tests.cmake)."""
import json
import os
import pathlib

import numpy as np
import pytest

try:
    import torch
    torch.set_num_threads(1)  # the machine's cores are shared with Kokkos and other ranks
except ImportError:  # pragma: no cover
    torch = None


def data_dir() -> pathlib.Path:
    """$KOMPRESS_DATA_DIR, else the full set (../shared/data beside the repository) where it
    exists, else the repository's sample (data/, data/README.md)."""
    repo = pathlib.Path(__file__).resolve().parents[2]
    full = repo.parent / "shared" / "data"
    path = pathlib.Path(os.environ.get("KOMPRESS_DATA_DIR") or (full if full.is_dir() else repo / "data"))
    if not (path / "manifest.json").is_file():
        pytest.fail(f"the test data is not at {path} (set KOMPRESS_DATA_DIR)")
    return path


def needs(name: str) -> None:
    """Skips the calling test (or module) when `name` is absent from the repository's sample,
    which holds only part of the full set; fails when it is absent from any other folder."""
    folder = data_dir()
    if (folder / name).exists():
        return
    if (folder / "sample.json").is_file():
        pytest.skip(f"needs {name}, which only the full data set has; {folder} is the repository's sample "
                    "(set KOMPRESS_DATA_DIR to the full set, ../shared/data)", allow_module_level=True)
    pytest.fail(f"{name} is not in the data folder {folder} (set KOMPRESS_DATA_DIR)")


def load(name: str) -> np.ndarray:
    """A file of the data folder, read in place, in its shape and dtype (manifest.json)."""
    needs(name)
    entry = next(e for e in json.loads((data_dir() / "manifest.json").read_text()) if e["file"] == name)
    return np.fromfile(data_dir() / name, dtype="<" + {"float32": "f4", "float64": "f8"}[entry["dtype"]]).reshape(
        entry["shape"])


def load_array(stem: str) -> np.ndarray:
    """The array called `stem` whatever its shape ("era5_t2m_uk": the full set's 744 hours or
    the sample's first 64), as load reads it."""
    names = [e["file"] for e in json.loads((data_dir() / "manifest.json").read_text())
             if e["file"].rsplit(".", 1)[0].rsplit("_", 1)[0] == stem]
    if len(names) != 1:
        pytest.fail(f"{len(names)} arrays called {stem}_<shape> in {data_dir()}")
    return load(names[0])


def repeat_rows(x: np.ndarray, rows: int) -> np.ndarray:
    """x, its rows repeated in order until it has at least `rows` (the sizes a test was written
    for, on the repository's sample, which keeps only an array's leading rows); x itself when it
    has them."""
    return x if x.shape[0] >= rows else np.concatenate([x] * -(-rows // x.shape[0]))


def assert_within(x, y, bound: float) -> None:
    """|x - x'| <= bound, exactly (in double), NaN where NaN was; no slack."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    assert x.shape == y.shape
    nan = np.isnan(x)
    assert np.array_equal(nan, np.isnan(y)), "NaN not kept in place"
    finite = np.isfinite(x)
    assert np.array_equal(x[~finite & ~nan], y[~finite & ~nan]), "infinities not kept exactly"
    err = np.abs(x[finite] - y[finite])
    worst = float(err.max()) if err.size else 0.0
    assert worst <= bound, f"bound violated: max error {worst!r} > {bound!r}"


def assert_same_on_every_rank(comm, x) -> None:
    """x holds the same bytes on every rank of comm (rank 0's, broadcast, compared bit by bit)."""
    root = comm.bcast(x, root=0)
    assert np.array_equal(root.view(np.uint8), x.view(np.uint8)), "results differ between ranks"
