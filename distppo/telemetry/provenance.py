"""Which distppo code a run ran (DESIGN 4.10): asked of the package itself, not of whatever
git repository happens to hold its folder.

- A checkout of distppo (an editable install, or the source on PYTHONPATH): the commit, and
  whether the tree had changes not committed (`dirty`). Only when the package folder sits at
  the top of distppo's own repository: the folder above it holds distppo's pyproject.toml
  and is git's top level. A copy of the package inside another repository (vendored, or a
  virtualenv inside a project's checkout) records no commit rather than that repository's.
- An installed copy: the package version, and the commit pip recorded when it installed
  from a git URL (`pip install 'distppo @ git+https://...@<commit>'`: PEP 610's
  direct_url.json).
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
from typing import Optional

DIST = "distppo"
# [project] name = "distppo" in pyproject.toml (read as text: tomllib is Python 3.11+)
PROJECT_NAME = re.compile(r'^\[project\][^\[]*?^name\s*=\s*["\']distppo["\']', re.M | re.S)


def package_dir() -> str:
    """The folder of the distppo package this module was imported from."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(cwd: str, *args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def checkout_root(package: Optional[str] = None) -> Optional[str]:
    """The root of distppo's own git checkout that holds `package`, or None."""
    root = os.path.dirname(package or package_dir())
    try:
        with open(os.path.join(root, "pyproject.toml")) as f:
            if not PROJECT_NAME.search(f.read()):
                return None
    except OSError:
        return None
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or os.path.realpath(top) != os.path.realpath(root):
        return None
    return root


def installed_commit() -> Optional[str]:
    """The commit pip recorded for an install from a git URL (PEP 610), or None."""
    try:
        text = importlib.metadata.distribution(DIST).read_text("direct_url.json")
        return json.loads(text or "{}").get("vcs_info", {}).get("commit_id")
    except (importlib.metadata.PackageNotFoundError, ValueError, AttributeError):
        return None


def provenance() -> dict:
    """{version, source ("checkout" | "installed"), commit, dirty (None where unknown)}."""
    try:
        version = importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:
        version = None
    root = checkout_root()
    if root is not None:
        commit = _git(root, "rev-parse", "HEAD")
        status = _git(root, "status", "--porcelain")
        return {"version": version, "source": "checkout", "commit": commit,
                "dirty": None if status is None or commit is None else bool(status)}
    return {"version": version, "source": "installed", "commit": installed_commit(),
            "dirty": None}


def git_commit(record: Optional[dict] = None) -> Optional[str]:
    """The commit as one string, `<sha>-dirty` for a tree with changes (git describe's
    mark), None when unknown: the `git_commit` of config.json and of a sweep's trials."""
    record = record or provenance()
    if not record["commit"]:
        return None
    return record["commit"] + ("-dirty" if record["dirty"] else "")
