"""launch/gpu_bundle.py, the wheels a GPU machine without a package index gets: a trimmed
wheel keeps a RECORD that matches its files, parts stay under their size, and --install puts
what the Python lacks (and only that) into the target folder, through pip, offline."""
import base64
import hashlib
import os
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
        "envpool/box2d/registration.py": "", "envpool/python/protocol.py": ""})
    out = gpu_bundle.trim(wheel, tmp_path / "out")
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        assert "envpool/atari/atari_envpool.so" in names
        assert "envpool/box2d/box2d_envpool.so" not in names
        assert "envpool/box2d/registration.py" in names  # Python stays, never imported
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


def test_parts_stay_under_their_size_with_the_common_ones_last(tmp_path):
    folder = tmp_path / "w"
    folder.mkdir()
    wheels = [make_wheel(folder, name, "1.0", {f"{name}/blob.bin": os.urandom(size).hex()})
              for name, size in (("aaa", 3000), ("bbb", 2500), ("ccc", 500), ("pandas", 1000))]
    limit = max(w.stat().st_size for w in wheels) + 1600
    parts = gpu_bundle.pack(wheels, tmp_path / "bundle", limit)
    contents = [sorted(gpu_bundle.dist_name(w) for w in p.iterdir()) for p in parts]
    assert contents[-1] == ["pandas"]  # what ML images have travels last, on its own
    assert sorted(sum(contents, [])) == ["aaa", "bbb", "ccc", "pandas"]
    for p in parts:
        assert sum(w.stat().st_size for w in p.iterdir()) <= limit
    big = make_wheel(folder, "ddd", "1.0", {"ddd/blob.bin": "x" * 5000})
    with pytest.raises(SystemExit, match="over the"):
        gpu_bundle.pack([big], tmp_path / "small", 100)


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


def test_tracked_tree_fits_beside_a_bundle_part():
    """A device call carries the working tree and .gpu-bundle/part1 in CARRIED_MIB: the tracked
    files must leave a whole part's room (the part itself where one is built here)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                            timeout=60)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no tracked tree to measure")
    paths = [os.path.join(REPO, f) for f in listed.stdout.decode().split("\0") if f]
    tree = sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
    built = Path(REPO) / ".gpu-bundle" / "part1"
    part = (sum(f.stat().st_size for f in built.iterdir()) if built.is_dir()
            else gpu_bundle.PART_MIB * 2**20)
    print(f"tracked tree {tree:,} bytes ({tree / 2**20:.1f} MiB) + bundle part "
          f"{part / 2**20:.1f} MiB = {(tree + part) / 2**20:.1f} of "
          f"{gpu_bundle.CARRIED_MIB} MiB")
    assert tree + part <= gpu_bundle.CARRIED_MIB * 2**20
