"""Wheels for a GPU machine that has Python and torch but no package index: what `distppo
train` and `distppo sweep` need beyond torch and numpy, trimmed so that part1 and the working
tree fit the device tool's 64 MiB per call (launch/gpu_check.sh installs what it finds).

    python launch/gpu_bundle.py                       # cp312 wheels into .gpu-bundle/part*/
    python launch/gpu_bundle.py --python-version 3.11 --out /tmp/b   # this machine's, to test
    python launch/gpu_bundle.py --size .gpu-bundle/part1   # what a device call would carry
    python launch/gpu_bundle.py --install .gpu-bundle --target /tmp/site   # on the GPU machine

Trimmed, as re-zipped wheels with a rewritten RECORD (pip installs them like any wheel):
- envpool: only its Atari family: the other families' compiled modules, binaries and assets
  (MuJoCo, VizDoom, Jumanji, the OpenGL libraries) go, and its entry point registers Atari
  alone (the other families' packages load their compiled module on import).
- envpool-assets: only the Atari ROMs.
- ray: no Java jars, RLlib, Serve, LLM or dashboard front end (distppo uses Core and Tune), and
  its compiled files without their symbol tables (`strip --strip-unneeded`, where binutils is
  installed): a crash's native stack trace then shows addresses instead of names.
part1 holds what the check needs and a torch image lacks; the later parts hold what such
images have (COMMON) and ale-py, which only `--backend ale` uses (EnvPool brings its own ALE).
Left out: OpenCV, imageio-ffmpeg and stable-baselines3 (the gym backend and videos), EnvPool's
type stubs, and whatever torch brings (numpy, filelock, ...), which the machine has.
gpu_check.sh installs each wheel only where its distribution is missing.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import os
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
    "dm-env", "optree", "tensorboardX==2.6.5", "psutil", "pandas", "pyarrow",
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
LATER = COMMON | {"ale-py"}  # ale-py: --backend ale alone, never the EnvPool rows
# The device tool carries 64 MiB per call: the working tree (tracked files and untracked ones
# git does not ignore) and the carried parts. The tree may take TREE_MIB of it, part1 the rest
# (tests/integration/test_gpu_bundle.py holds the tree to its share).
CALL_MIB = 64.0
TREE_MIB = 16.0
NO_DEPS = {"envpool"}  # its other requirements are the MuJoCo assets, glfw, matplotlib
SKIP = {  # the machine's torch brings these; a second copy could shadow the one torch uses
    "numpy", "torch", "filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2",
    "markupsafe", "fsspec", "setuptools", "triton",
}
TRIM = {  # distribution -> top-level paths inside the wheel to drop
    # every family's Python stays (never imported but by its own registration), the rest of
    # each family but Atari goes
    "envpool": lambda name: name.startswith("envpool.libs/") or (
        name.startswith("envpool/") and not name.startswith("envpool/atari/")
        and not name.endswith((".py", ".pyi", "py.typed"))),
    "envpool-assets": lambda name: name.startswith("envpool_assets/")
    and not name.startswith(("envpool_assets/atari/", "envpool_assets/__init__")),
    "ray": lambda name: name.startswith(("ray/jars/", "ray/rllib/", "ray/serve/", "ray/llm/",
                                         "ray/dashboard/client/")),
}

STRIP = {"ray"}  # distributions whose ELF files lose their symbol tables

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
    """The wheel without the paths TRIM drops, with PATCH's files changed and STRIP's ELF
    files stripped, its RECORD rewritten to match."""
    dist = dist_name(wheel)
    drop = TRIM.get(dist)
    patch = PATCH.get(dist, {})
    strip = shutil.which("strip") if dist in STRIP else None
    if drop is None and strip is None:
        return Path(shutil.copy2(wheel, out / wheel.name))
    target = out / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED,
                                                        compresslevel=9) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for info in src.infolist():
            if (drop and drop(info.filename)) or info.filename == record_name:
                continue
            data = src.read(info)
            if info.filename in patch:
                data = patch[info.filename](data.decode()).encode()
            if strip and data.startswith(b"\x7fELF"):
                data = stripped(strip, data)
            dst.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            rows.append(f"{info.filename},sha256={digest.decode()},{len(data)}")
        rows.append(f"{record_name},,")
        dst.writestr(record_name, "\n".join(rows) + "\n")
    return target


def stripped(strip: str, data: bytes) -> bytes:
    """An ELF file without its symbol table; the dynamic symbols it links by stay."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "elf"
        path.write_bytes(data)
        subprocess.run([strip, "--strip-unneeded", str(path)], check=True)
        return path.read_bytes()


def pack(wheels: list[Path], out: Path, max_bytes: int) -> list[Path]:
    """Wheels into part1/, part2/, ... of at most max_bytes each (first fit, largest first);
    the LATER ones in the last parts. Two versions of one distribution are refused: the
    install would keep whichever pip met last."""
    names = sorted(dist_name(w) for w in wheels)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SystemExit(f"gpu_bundle: two versions of {', '.join(twice)}: pin one")
    parts = fit([w for w in wheels if dist_name(w) not in LATER], max_bytes)
    parts += fit([w for w in wheels if dist_name(w) in LATER], max_bytes, strict=False)
    folders = []
    for i, members in enumerate(parts, start=1):
        folder = out / f"part{i}"
        folder.mkdir(parents=True)
        for w in members:
            shutil.move(str(w), folder / w.name)
        folders.append(folder)
    return folders


def fit(wheels: list[Path], max_bytes: int, strict: bool = True) -> list[list[Path]]:
    """First fit, largest first: the wheels of each part. A wheel over one part is refused,
    or with strict=False (what the machines' images have) left out, said so."""
    parts: list[list] = []  # [bytes, [wheels]]
    for w in sorted(wheels, key=lambda w: -w.stat().st_size):
        size = w.stat().st_size
        if size > max_bytes and not strict:
            print(f"gpu_bundle: left out {w.name}, {size / 2**20:.1f} MiB, over one part: "
                  f"the GPU machine must have it")
            continue
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
        # Byte-compiled once, on every core: where PYTHONDONTWRITEBYTECODE is set, each Ray
        # process would otherwise compile Ray's modules again, and a raylet gives its agent
        # seconds to start before it fails the node
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(target)],
                       check=False, stdout=subprocess.DEVNULL)


def installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def call_size(root: Path, carry: list[Path], limit_mib: float = CALL_MIB) -> int:
    """Prints what a device call from `root` carrying `carry` holds: in a git work tree its
    tracked files, the untracked ones git does not ignore and the carried paths; elsewhere
    (the copy on the device machine) every file under `root`. SystemExit over `limit_mib`."""
    groups = listed(root)
    if groups is None:
        groups = {"files under the tree": walk(root)}
    else:
        groups["carried"] = [f for c in carry for f in walk(c)]
    seen: set = set()
    total = 0
    for what, files in groups.items():
        files = [f for f in files if f not in seen]
        seen.update(files)
        size = sum(os.lstat(f).st_size for f in files)
        total += size
        print(f"device call: {what}: {len(files)} files, {size / 2**20:.1f} MiB")
    verdict = "fits" if total <= limit_mib * 2**20 else "OVER"
    print(f"device call: {total / 2**20:.1f} MiB of {limit_mib:.0f} MiB: {verdict}")
    if verdict == "OVER":
        raise SystemExit(f"gpu_bundle: a device call would carry {total / 2**20:.1f} MiB, over "
                         f"its {limit_mib:.0f} MiB: trim the bundle or the tracked tree")
    return total


def listed(root: Path) -> dict | None:
    """{what: [files]} of the tracked files and the untracked ones git does not ignore, the
    files a device call copies; None outside a git work tree."""
    groups = {}
    for what, flags in (("tracked", []), ("untracked, not ignored", ["--others",
                                                                     "--exclude-standard"])):
        try:
            out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", *flags],
                                 capture_output=True, check=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        names = [root / n for n in out.decode().split("\0") if n]
        groups[what] = [str(n) for n in names if os.path.lexists(n)]  # a deleted file is not sent
    return groups


def walk(path: Path) -> list[str]:
    """Every file (links as links) under `path`, or `path` itself if it is a file."""
    if not os.path.isdir(path) or os.path.islink(path):
        return [str(path)] if os.path.lexists(path) else []
    return [os.path.join(d, f) for d, _, files in os.walk(path) for f in files]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    ap.add_argument("--out", default=".gpu-bundle", help="folder for part1/, part2/, ...")
    ap.add_argument("--max-mib", type=float, default=CALL_MIB - TREE_MIB,
                    help="size of one part: the device tool carries 64 MiB per call, of which "
                         f"the working tree may take {TREE_MIB:.0f}")
    ap.add_argument("--size", nargs="*", metavar="CARRY",
                    help="instead: print the MiB a device call from this tree carrying CARRY "
                         "(e.g. .gpu-bundle/part1) holds; exit 1 over 64 MiB")
    ap.add_argument("--install", metavar="BUNDLE",
                    help="instead: install what this Python lacks of BUNDLE's carried parts")
    ap.add_argument("--target", default="/tmp/site",
                    help="with --install: the folder it installs into (put it on PYTHONPATH)")
    args = ap.parse_args()
    if args.size is not None:
        call_size(Path("."), [Path(c) for c in args.size])
        return
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
    needed = [f for f in folders if any(dist_name(w) not in LATER for w in f.iterdir())]
    if len(needed) > 1:
        raise SystemExit(f"gpu_bundle: the check needs {len(needed)} parts, more than one call "
                         f"carries: trim the wheels further")
    call_size(Path("."), [folders[0]])


if __name__ == "__main__":
    main()
