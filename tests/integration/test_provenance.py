"""Which distppo code a run records (telemetry/provenance.py): the commit and dirty flag of
distppo's own checkout, nothing from a repository that merely holds a copy of the package, and
for an installed copy its version and the commit pip recorded. Real git repositories and real
package metadata, read by a fresh Python process."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import REPO

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


def git(cwd, *args) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout.strip()


def copy_package(dest: Path) -> None:
    shutil.copytree(Path(REPO) / "distppo", dest / "distppo",
                    ignore=shutil.ignore_patterns("__pycache__"))


def provenance_of(path: Path) -> dict:
    """provenance() and git_commit() as the package imported from `path` reports them."""
    code = ("import json, distppo.telemetry.provenance as p\n"
            f"assert p.__file__.startswith({str(path)!r}), p.__file__\n"
            "r = p.provenance(); print(json.dumps(dict(r, git_commit=p.git_commit(r))))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True,
                         timeout=120, env=dict(env, PYTHONPATH=str(path)))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_this_checkout_records_its_commit_and_dirty_flag():
    head = git(REPO, "rev-parse", "HEAD")
    dirty = bool(git(REPO, "status", "--porcelain"))
    record = provenance_of(Path(REPO))
    assert (record["source"], record["commit"], record["dirty"]) == ("checkout", head, dirty)
    assert record["git_commit"] == head + ("-dirty" if dirty else "")


def test_copy_inside_another_repository_records_no_commit(tmp_path):
    outer = tmp_path / "project"
    (outer / "vendor").mkdir(parents=True)
    (outer / "README").write_text("another project\n")
    git(outer, "init", "-q")
    git(outer, "add", "README")
    git(outer, "commit", "-qm", "other")
    # the package alone, and the package with distppo's pyproject, both below another repo
    copy_package(outer / "vendor")
    for where in (outer / "vendor", outer / "vendor-with-pyproject"):
        if not where.exists():
            where.mkdir()
            copy_package(where)
            shutil.copy(Path(REPO) / "pyproject.toml", where / "pyproject.toml")
        record = provenance_of(where)
        assert record["commit"] is None and record["git_commit"] is None, (where, record)
        assert record["source"] == "installed"


def test_own_checkout_clean_then_dirty(tmp_path):
    repo = tmp_path / "distppo-src"
    repo.mkdir()
    copy_package(repo)
    shutil.copy(Path(REPO) / "pyproject.toml", repo / "pyproject.toml")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "distppo")
    head = git(repo, "rev-parse", "HEAD")
    assert provenance_of(repo) | {"version": None} == {
        "version": None, "source": "checkout", "commit": head, "dirty": False,
        "git_commit": head}
    with open(repo / "distppo" / "errors.py", "a") as f:
        f.write("\n# a local change\n")
    record = provenance_of(repo)
    assert (record["commit"], record["dirty"], record["git_commit"]) == (
        head, True, head + "-dirty")


def test_installed_copy_records_version_and_pips_vcs_commit(tmp_path):
    """A non-editable install from a git URL: pip's PEP 610 record names the commit."""
    site = tmp_path / "site-packages"
    site.mkdir()
    copy_package(site)
    info = site / "distppo-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: distppo\nVersion: 0.1.0\n")
    commit = "0123456789abcdef0123456789abcdef01234567"
    (info / "direct_url.json").write_text(json.dumps(
        {"url": "https://example.com/distppo.git",
         "vcs_info": {"vcs": "git", "commit_id": commit}}))
    record = provenance_of(site)
    assert record == {"version": "0.1.0", "source": "installed", "commit": commit,
                      "dirty": None, "git_commit": commit}
    (info / "direct_url.json").unlink()  # installed from a wheel or a folder: version only
    assert provenance_of(site)["git_commit"] is None
