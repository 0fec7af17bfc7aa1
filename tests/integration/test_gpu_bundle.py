"""launch/gpu_bundle.py, the wheels a GPU machine without a package index gets: a trimmed
wheel keeps a RECORD that matches its files, parts stay under their size, --install puts what
the Python lacks (and only that) into the target folder, through pip, offline, and --size says
what a device call carries (the tree and the parts) and refuses over its 64 MiB."""
import base64
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import REPO

sys.path.insert(0, os.path.join(REPO, "launch"))
import gpu_bundle  # noqa: E402


def make_wheel(folder: Path, name: str, version: str, files: dict) -> Path:
    """A pure-Python wheel holding `files` {path: text}, with the metadata pip needs."""
    info = f"{name}-{version}.dist-info"
    files = {**files,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n")
    return path


def test_trimmed_envpool_keeps_atari_and_a_matching_record(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    wheel = make_wheel(tmp_path / "in", "envpool", "1.2.5", {
        "envpool/__init__.py": "import envpool.entry\n",
        "envpool/entry.py": '"""doc"""\n\nimport envpool.atari.registration  # noqa: F401\n'
                            "import envpool.box2d.registration  # noqa: F401\n",
        "envpool/atari/atari_envpool.so": "atari", "envpool/box2d/box2d_envpool.so": "box2d",
        "envpool/box2d/registration.py": "", "envpool/python/protocol.py": "",
        "envpool/vizdoom/bin/vizdoom": "doom", "envpool/jumanji/assets/puzzles.npy": "npy",
        "envpool.libs/libOpenGL-4c5f8d52.so.0.0.0": "gl", "envpool/py.typed": ""})
    out = gpu_bundle.trim(wheel, tmp_path / "out")
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        assert "envpool/atari/atari_envpool.so" in names
        assert "envpool/box2d/box2d_envpool.so" not in names
        assert "envpool/box2d/registration.py" in names  # Python stays, never imported
        assert "envpool/python/protocol.py" in names and "envpool/py.typed" in names
        for gone in ("envpool/vizdoom/bin/vizdoom", "envpool/jumanji/assets/puzzles.npy",
                     "envpool.libs/libOpenGL-4c5f8d52.so.0.0.0"):
            assert gone not in names
        entry = z.read("envpool/entry.py").decode()
        assert "envpool.atari.registration" in entry and "box2d" not in entry
        assert entry.startswith('"""doc"""')
        record = z.read("envpool-1.2.5.dist-info/RECORD").decode().splitlines()
        listed = {row.split(",")[0] for row in record}
        assert listed == names
        for row in record:
            n, digest, size = row.split(",")
            if n.endswith("RECORD"):
                continue
            data = z.read(n)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={want}" and int(size) == len(data), n


def test_parts_stay_under_their_size_with_the_common_ones_last(tmp_path, capsys):
    folder = tmp_path / "w"
    folder.mkdir()
    wheels = [make_wheel(folder, name, "1.0", {f"{name}/blob.bin": os.urandom(size).hex()})
              for name, size in (("aaa", 3000), ("bbb", 2500), ("ccc", 500), ("pandas", 1000),
                                 ("ale_py", 900))]
    limit = max(w.stat().st_size for w in wheels) + 1600
    parts = gpu_bundle.pack(wheels, tmp_path / "bundle", limit)
    contents = [sorted(gpu_bundle.dist_name(w) for w in p.iterdir()) for p in parts]
    # what ML images have, and ale-py (--backend ale alone), travel last, on their own
    assert contents[-1] == ["ale-py", "pandas"]
    assert sorted(sum(contents, [])) == ["aaa", "ale-py", "bbb", "ccc", "pandas"]
    for p in parts:
        assert sum(w.stat().st_size for w in p.iterdir()) <= limit
    big = make_wheel(folder, "ddd", "1.0", {"ddd/blob.bin": "x" * 5000})
    with pytest.raises(SystemExit, match="over the"):
        gpu_bundle.pack([big], tmp_path / "small", 100)
    # a wheel the machines' images have, over one part, is left out, said so
    huge = make_wheel(folder, "pyarrow", "1.0", {"pyarrow/blob.bin": os.urandom(5000).hex()})
    small = make_wheel(folder, "eee", "1.0", {"eee/x.py": ""})
    parts = gpu_bundle.pack([huge, small], tmp_path / "lean", small.stat().st_size + 100)
    assert [sorted(w.name for w in p.iterdir()) for p in parts] == [[small.name]]
    assert "left out pyarrow-1.0-py3-none-any.whl" in capsys.readouterr().out
    (tmp_path / "v2").mkdir()
    again = make_wheel(tmp_path / "v2", "eee", "2.0", {"eee/x.py": ""})
    with pytest.raises(SystemExit, match="two versions of eee"):
        gpu_bundle.pack([small, again], tmp_path / "twice", 10**6)


@pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("strip")),
                    reason="needs gcc and binutils' strip")
def test_a_stripped_binary_in_ray_still_runs_without_its_symbol_table(tmp_path):
    source = tmp_path / "seven.c"
    source.write_text("static int seven(void) { return 7; }\nint main(void) { return seven(); }\n")
    binary = tmp_path / "seven"
    subprocess.run(["gcc", "-g", "-o", str(binary), str(source)], check=True, timeout=120)
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    wheel = make_wheel(tmp_path / "in", "ray", "2.60.0", {"ray/__init__.py": ""})
    with zipfile.ZipFile(wheel, "a") as z:
        info = zipfile.ZipInfo("ray/core/seven")
        info.external_attr = (stat.S_IFREG | 0o755) << 16
        z.writestr(info, binary.read_bytes())
    out = gpu_bundle.trim(wheel, tmp_path / "out")
    with zipfile.ZipFile(out) as z:
        data = z.read("ray/core/seven")
        assert z.read("ray/__init__.py") == b""
        mode = z.getinfo("ray/core/seven").external_attr >> 16
    assert len(data) < binary.stat().st_size and b".symtab" not in data
    assert b".symtab" in binary.read_bytes()  # what was stripped was there
    assert mode & 0o111
    runnable = tmp_path / "stripped"
    runnable.write_bytes(data)
    runnable.chmod(0o755)
    assert subprocess.run([str(runnable)], timeout=60).returncode == 7


def test_install_puts_only_what_this_python_lacks_into_the_target(tmp_path):
    part = tmp_path / "bundle" / "part1"
    part.mkdir(parents=True)
    make_wheel(part, "distppo_bundle_probe", "0.1", {"distppo_bundle_probe/__init__.py": "X = 1\n"})
    make_wheel(part, "pytest", "0.0.1", {"pytest_fake/__init__.py": ""})  # pytest is installed
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "gpu_bundle.py"),
                          "--install", str(tmp_path / "bundle"), "--target", str(site)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "2 wheels carried, 1 to install (distppo-bundle-probe)" in out.stdout
    assert (site / "distppo_bundle_probe" / "__init__.py").read_text() == "X = 1\n"
    assert not (site / "pytest_fake").exists()
    empty = subprocess.run([sys.executable, os.path.join(REPO, "launch", "gpu_bundle.py"),
                            "--install", str(tmp_path / "none")],
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode != 0 and "no wheels under" in empty.stderr


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, timeout=60)


def test_size_counts_what_a_device_call_copies_and_refuses_over_the_limit(tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    git(repo, "init", "-q")
    ignore = "/.gpu-bundle/\n/ignored.bin\n"
    (repo / ".gitignore").write_text(ignore)
    (repo / "src" / "tracked.bin").write_bytes(b"t" * 30000)
    git(repo, "add", ".gitignore", "src/tracked.bin")
    (repo / "untracked.bin").write_bytes(b"u" * 10000)  # copied: git does not ignore it
    (repo / "ignored.bin").write_bytes(b"i" * 50000)  # not copied
    (repo / ".gpu-bundle" / "part1").mkdir(parents=True)
    (repo / ".gpu-bundle" / "part1" / "w.whl").write_bytes(b"w" * 20000)
    (repo / ".gpu-bundle" / "part2").mkdir()
    (repo / ".gpu-bundle" / "part2" / "x.whl").write_bytes(b"x" * 40000)  # not carried
    total = gpu_bundle.call_size(repo, [repo / ".gpu-bundle" / "part1"])
    assert total == 30000 + len(ignore) + 10000 + 20000
    out = capsys.readouterr().out
    assert "tracked: 2 files" in out and "untracked, not ignored: 1 files" in out
    assert "carried: 1 files" in out and "fits" in out
    with pytest.raises(SystemExit, match="over its 0 MiB"):
        gpu_bundle.call_size(repo, [repo / ".gpu-bundle"], limit_mib=0.05)
    # the copy on the device machine is no git work tree: every file under it arrived
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    assert gpu_bundle.call_size(copy, []) == sum(
        p.stat().st_size for p in copy.rglob("*") if p.is_file())


def test_the_working_tree_leaves_part1_its_share_of_a_device_call():
    """The tracked tree (and untracked files git would copy) stays within TREE_MIB, the share
    gpu_bundle.py builds part1 to leave it: together they fit one call."""
    groups = gpu_bundle.listed(Path(REPO))
    assert groups is not None, "not a git work tree"
    size = sum(os.lstat(f).st_size for files in groups.values() for f in files)
    assert size <= gpu_bundle.TREE_MIB * 2**20, (
        f"the working tree is {size / 2**20:.1f} MiB, over the {gpu_bundle.TREE_MIB:.0f} MiB "
        f"it may take of a device call: move data out of the tracked tree")
