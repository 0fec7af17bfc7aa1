"""`distppo report`: a sweep's Parquet files -> tables, scores, plots and report.json.

    distppo report SWEEP --out DIR [--reference NAME ...]
    distppo report --compare A B --out DIR [--algos ALGO_A ALGO_B]

SWEEP, A and B are sweep folders (a local path or any pyarrow URI: s3://, gs://, file://).
Writes runtimes.md, returns.md, summary.md, learning_curves.png, learning_curves_time.png,
runtimes.png and report.json (or compare.md and compare.json) into DIR, which may also be a
URI. Ray-free: reads files, computes, writes files (DESIGN.md section 2).
Definitions and caveats: docs/report.md.
"""
from __future__ import annotations

import json
import os
import tempfile

from distppo.errors import UserError

DEFAULT_REPS = 50_000  # openrlbenchmark's bootstrap replications


def write_report(sweep_uri: str, out: str, reference=None, reps: int = DEFAULT_REPS,
                 seed: int = 0, plots: bool = True) -> list[str]:
    """Every report file for one sweep into `out`; returns the file names written."""
    from distppo.report import load, markdown, references, tables
    names = references.check_names(reference) if reference is not None else None
    sweep = load.load(sweep_uri)
    report = tables.build(sweep, names, reps, seed)
    texts = {"runtimes.md": markdown.runtimes_md(report), "returns.md": markdown.returns_md(report),
             "summary.md": markdown.summary_md(report), "report.json": _json(report)}
    with _output_dir(out) as folder:
        for name, text in texts.items():
            with open(os.path.join(folder, name), "w") as fh:
                fh.write(text)
        if plots:
            from distppo.report import plots as figures
            figures.learning_curves(sweep, os.path.join(folder, "learning_curves.png"))
            figures.learning_curves(sweep, os.path.join(folder, "learning_curves_time.png"),
                                    x="minutes")
            figures.runtime_bars(report, os.path.join(folder, "runtimes.png"))
        return sorted(os.listdir(folder))


def write_compare(uri_a: str, uri_b: str, out: str, algos=None, reps: int = DEFAULT_REPS,
                  seed: int = 0) -> list[str]:
    from distppo.report import compare, load
    a = load.load(uri_a)
    b = a if uri_b.rstrip("/") == uri_a.rstrip("/") else load.load(uri_b)
    algo_a, algo_b = algos or (None, None)
    result = compare.build(a, b, algo_a, algo_b, reps, seed)
    with _output_dir(out) as folder:
        with open(os.path.join(folder, "compare.md"), "w") as fh:
            fh.write(compare.compare_md(result))
        with open(os.path.join(folder, "compare.json"), "w") as fh:
            fh.write(_json(result))
        return sorted(os.listdir(folder))


def _json(obj) -> str:
    # allow_nan=False: a NaN that slipped past tables.num() fails here, not in a reader.
    return json.dumps(obj, indent=1, allow_nan=False, default=_plain) + "\n"


def _plain(x):
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


class _output_dir:
    """A local folder to write into; for a URI, a temp folder copied there on success."""

    def __init__(self, out: str) -> None:
        self.out = out
        self._tmp = None

    def __enter__(self) -> str:
        if "://" not in self.out:
            try:
                os.makedirs(self.out, exist_ok=True)
            except OSError as exc:
                raise UserError(f"cannot create output folder {self.out}: {exc.strerror}") from None
            return self.out
        self._tmp = tempfile.TemporaryDirectory(prefix="distppo-report-")
        return self._tmp.name

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._tmp is None:
            return
        try:
            if exc_type is None:
                import pyarrow.fs as pafs

                from distppo.sweep.layout import filesystem
                # as every storage URI is opened: gs:// follows STORAGE_EMULATOR_HOST, and a
                # storage that does not answer is one line within the storage timeout
                fs, path = filesystem(self.out, "--out")
                try:
                    fs.create_dir(path, recursive=True)
                    pafs.copy_files(self._tmp.name, path, destination_filesystem=fs)
                except (OSError, ValueError) as err:
                    raise UserError(f"cannot write the report to {self.out}: "
                                    f"{str(err).splitlines()[0]}") from None
        finally:
            self._tmp.cleanup()
