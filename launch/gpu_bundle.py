"""Wheels for a GPU machine that has Python and torch but no package index: what `distppo
train` and `distppo bench` need beyond torch and numpy, trimmed to fit the device tool's 64 MiB
per call, in parts that travel one call each (launch/gpu_check.sh installs what it finds).

    python launch/gpu_bundle.py                       # cp312 wheels into .gpu-bundle/part*/
    python launch/gpu_bundle.py --python-version 3.11 --out /tmp/b   # this machine's, to test
    python launch/gpu_bundle.py --install .gpu-bundle --target /tmp/site   # on the GPU machine

Trimmed, as re-zipped wheels with a rewritten RECORD (pip installs them like any wheel):
- envpool: only its Atari family: the other families' compiled modules (MuJoCo, VizDoom, ...)
  go, and its entry point registers Atari alone (the other families' packages load their
  compiled module on import).
- envpool-assets: only the Atari ROMs.
- ray: no Java jars, RLlib, Serve, LLM or dashboard front end (distppo uses Core and Tune).
Left out: OpenCV, imageio-ffmpeg and stable-baselines3 (the gym backend and videos; the GPU
check runs EnvPool or `--backend ale`), and whatever torch brings (numpy, filelock, ...), which
the machine has. gpu_check.sh installs each wheel only where its distribution is missing.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# What distppo imports to train on EnvPool / ale-py, record metrics and run Ray and Tune
# (pyproject.toml's dependencies and train extra, less the gym backend's and video's).
REQUIREMENTS = [
    "envpool==1.2.5", "envpool-assets==0.3.0", "ale-py==0.12.1", "gymnasium==1.4.0",
    "dm-env", "optree", "types-protobuf", "tensorboardX==2.6.5", "psutil", "pandas", "pyarrow",
    # Core and Tune: a local Ray starts no dashboard, so ray[default]'s server side stays home
    "ray[tune]==2.60.0",
    "pytest",  # the gpu-marked tests
]
# What an ML image with torch usually has already (the device machines' image has each): in the
# last parts, which such a machine need not carry
COMMON = {
    "pyarrow", "pandas", "tzdata", "python-dateutil", "six", "protobuf", "psutil", "pyyaml",
    "requests", "urllib3", "idna", "certifi", "charset-normalizer", "click", "msgpack", "attrs",
    "packaging", "cloudpickle", "absl-py", "wrapt", "pytest", "pluggy", "iniconfig", "pygments",
}
# one part's size: a device call carries 64 MiB, the repository's tracked files included, so
# the tracked tree must stay under the rest (tests/integration/test_gpu_bundle.py checks it)
CARRIED_MIB = 64
PART_MIB = 56.0
NO_DEPS = {"envpool"}  # its other requirements are the MuJoCo assets, glfw, matplotlib
SKIP = {  # the machine's torch brings these; a second copy could shadow the one torch uses
    "numpy", "torch", "filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2",
    "markupsafe", "fsspec", "setuptools", "triton",
}
TRIM = {  # distribution -> top-level paths inside the wheel to drop
    "envpool": lambda name: name.startswith("envpool/") and name.endswith(".so")
    and not name.startswith("envpool/atari/"),
    "envpool-assets": lambda name: name.startswith("envpool_assets/")
    and not name.startswith(("envpool_assets/atari/", "envpool_assets/__init__")),
    "ray": lambda name: name.startswith(("ray/jars/", "ray/rllib/", "ray/serve/", "ray/llm/",
                                         "ray/dashboard/client/")),
}

PATCH = {  # distribution -> {path in the wheel: new text from the old}
    "envpool": {"envpool/entry.py": lambda text: "".join(
        line for line in text.splitlines(keepends=True)
        if not line.startswith("import envpool.") or line.startswith("import envpool.atari."))},
}


def dist_name(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower().replace("_", "-")


def download(dest: Path, python_version: str) -> list[Path]:
    platform = ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_27_x86_64",
                "--platform", "any"]
    common = [sys.executable, "-m", "pip", "download", "-q", "--dest", str(dest),
              "--only-binary=:all:", "--python-version", python_version, "--implementation",
              "cp", *platform]
    deps = [r for r in REQUIREMENTS if r.split("=")[0].split("[")[0] not in NO_DEPS]
    subprocess.run(common + deps, check=True)
    subprocess.run(common + ["--no-deps"] + [r for r in REQUIREMENTS if r not in deps],
                   check=True)
    return sorted(w for w in dest.glob("*.whl") if dist_name(w) not in SKIP)


def trim(wheel: Path, out: Path) -> Path:
    """The wheel without the paths TRIM drops, with PATCH's files changed, its RECORD
    rewritten to match."""
    drop = TRIM.get(dist_name(wheel))
    patch = PATCH.get(dist_name(wheel), {})
    if drop is None:
        return Path(shutil.copy2(wheel, out / wheel.name))
    target = out / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED,
                                                        compresslevel=9) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for info in src.infolist():
            if drop(info.filename) or info.filename == record_name:
                continue
            data = src.read(info)
            if info.filename in patch:
                data = patch[info.filename](data.decode()).encode()
            dst.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            rows.append(f"{info.filename},sha256={digest.decode()},{len(data)}")
        rows.append(f"{record_name},,")
        dst.writestr(record_name, "\n".join(rows) + "\n")
    return target


def pack(wheels: list[Path], out: Path, max_bytes: int) -> list[Path]:
    """Wheels into part1/, part2/, ... of at most max_bytes each (first fit, largest first);
    the COMMON ones in the last parts."""
    parts = fit([w for w in wheels if dist_name(w) not in COMMON], max_bytes)
    parts += fit([w for w in wheels if dist_name(w) in COMMON], max_bytes)
    folders = []
    for i, members in enumerate(parts, start=1):
        folder = out / f"part{i}"
        folder.mkdir(parents=True)
        for w in members:
            shutil.move(str(w), folder / w.name)
        folders.append(folder)
    return folders


def fit(wheels: list[Path], max_bytes: int) -> list[list[Path]]:
    """First fit, largest first: the wheels of each part."""
    parts: list[list] = []  # [bytes, [wheels]]
    for w in sorted(wheels, key=lambda w: -w.stat().st_size):
        size = w.stat().st_size
        if size > max_bytes:
            raise SystemExit(f"gpu_bundle: {w.name} is {size / 2**20:.1f} MiB, over the "
                             f"{max_bytes / 2**20:.0f} MiB of one part: trim it further")
        home = next((p for p in parts if p[0] + size <= max_bytes), None)
        if home is None:
            home = [0, []]
            parts.append(home)
        home[0] += size
        home[1].append(w)
    return [members for _, members in parts]


def install(bundle: Path, target: Path) -> None:
    """pip-installs into `target` (a folder for PYTHONPATH), without an index or dependency
    resolution, every wheel in the bundle's parts whose distribution this Python lacks: what
    the machine has stays as it is, and nothing is written outside `target`."""
    wheels = sorted(bundle.glob("part*/*.whl"))
    if not wheels:
        raise SystemExit(f"gpu_bundle: no wheels under {bundle}/part*/: carry the parts there")
    missing = [w for w in wheels if not installed(dist_name(w))]
    print(f"gpu_bundle: {len(wheels)} wheels carried, {len(missing)} to install "
          f"({', '.join(dist_name(w) for w in missing) or 'none'})")
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--upgrade", "--target", str(target),
                        *map(str, missing)], check=True)


def installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    ap.add_argument("--out", default=".gpu-bundle", help="folder for part1/, part2/, ...")
    ap.add_argument("--max-mib", type=float, default=PART_MIB,
                    help="size of one part (the device tool carries 64 MiB per call, the "
                         "repository's files included)")
    ap.add_argument("--install", metavar="BUNDLE",
                    help="instead: install what this Python lacks of BUNDLE's carried parts")
    ap.add_argument("--target", default="/tmp/site",
                    help="with --install: the folder it installs into (put it on PYTHONPATH)")
    args = ap.parse_args()
    if args.install:
        install(Path(args.install), Path(args.target))
        return
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    with tempfile.TemporaryDirectory() as tmp:
        raw, trimmed = Path(tmp) / "raw", Path(tmp) / "trimmed"
        raw.mkdir()
        trimmed.mkdir()
        wheels = [trim(w, trimmed) for w in download(raw, args.python_version)]
        folders = pack(wheels, out, int(args.max_mib * 2**20))
    for folder in folders:
        files = sorted(folder.iterdir())
        size = sum(f.stat().st_size for f in files)
        print(f"{folder}: {len(files)} wheels, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
