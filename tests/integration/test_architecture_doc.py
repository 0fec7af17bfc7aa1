"""docs/architecture.md's module table against the tree: every module of distppo/ has a row
(a path, a sibling named after one, or a package row whose text names it), and every module a
row names exists, so the map a contributor reads stays the code's."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "distppo"


def table_rows() -> list[str]:
    lines = (ROOT / "docs" / "architecture.md").read_text().splitlines()
    start = lines.index("| module | Ray? | role |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def named_modules() -> set[str]:
    """The module paths (relative to distppo/) the table names."""
    named = set()
    for row in table_rows():
        first, rest = row.split("|")[1], "|".join(row.split("|")[2:])
        folder = ""
        for path in re.findall(r"`([^`]+)`", first):
            if path.endswith("/"):  # a package row: the modules its text names
                named |= {path + m for m in re.findall(r"`([a-z_]+\.py)`", rest)}
            elif "/" in path:
                folder = path.rsplit("/", 1)[0]
                named.add(path)
            else:  # a sibling of the path before it
                named.add(f"{folder}/{path}" if folder else path)
    return named


def test_every_module_has_a_row_and_every_row_a_module():
    tree = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
            if p.name not in ("__init__.py", "__main__.py")}
    named = named_modules()
    assert not tree - named, f"modules missing from docs/architecture.md: {sorted(tree - named)}"
    assert not named - tree, f"rows naming no module: {sorted(named - tree)}"
