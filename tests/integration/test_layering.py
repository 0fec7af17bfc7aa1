"""DESIGN.md section 2: the import graph has no cycle and no upward arrow; Ray stays in the
Ray shells and the sweep."""
import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "distppo"

# Bottom to top; a module may import its own layer and the layers below it, never above.
LAYERS = [
    {"errors", "testing"},
    {"envs"},
    {"config"},
    {"telemetry"},
    {"placement"},
    {"core"},
    {"distributed", "bench"},
    {"sweep"},
    {"report"},
    {"cli", "__main__", "__init__"},
]
RAY_FREE_PACKAGES = ("core", "placement", "envs", "telemetry", "report")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """distppo modules imported anywhere in the file (module level or inside functions)."""
    tree = ast.parse(path.read_text())
    found = set()
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" \
        else module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("distppo")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            if base.startswith("distppo"):
                found.add(base)
                # `from distppo.x import y` may import the module distppo.x.y
                for alias in node.names:
                    candidate = f"{base}.{alias.name}"
                    if (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists():
                        found.add(candidate)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {i for i in imports_of(path) if i in modules and i != name}
            for name, path in modules.items()}


def layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{module} is in no layer of tests/integration/test_layering.py: add it")


def test_import_graph_has_no_cycle():
    edges = graph()
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_no_module_imports_upward():
    upward = [f"{a} -> {b}" for a, deps in graph().items() for b in deps
              if layer_of(b) > layer_of(a)]
    assert not upward, "imports pointing up the layers: " + ", ".join(sorted(upward))


def test_the_graph_sees_real_imports():
    # a guard against a parser that finds nothing: known edges must be there
    edges = graph()
    assert "distppo.core.ppo" in edges["distppo.core.update"]
    assert "distppo.errors" in edges["distppo.config.sections"]
    assert "distppo.config.train" in edges["distppo.config"]
    assert "distppo.distributed.runtime" in edges["distppo.distributed.factory"]


def test_only_connect_starts_ray():
    callers = [module_name(p) for p in PACKAGE.rglob("*.py")
               if "ray.init(" in p.read_text()]
    assert callers == ["distppo.distributed.connect"]


def run_python(code: str) -> None:
    """`code` in a fresh interpreter, which must exit 0 (its modules loaded from scratch)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_core_envs_telemetry_report_import_without_ray():
    # a None entry in sys.modules makes any `import ray` raise ImportError
    modules = sorted(m for m in graph() if m.split(".")[1:2]
                     and m.split(".")[1] in RAY_FREE_PACKAGES)
    assert "distppo.core.loop" in modules and "distppo.report.write" in modules
    code = "import sys; sys.modules['ray'] = None\n" + "".join(f"import {m}\n" for m in modules)
    run_python(code)


def test_local_training_runs_without_ray(tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"
            "from distppo.cli.main import main\n"
            f"sys.exit(main(['train', '--local', '--env-id', 'CartPole-v1', '--backend', 'gym',"
            f" '--num-envs', '2', '--num-steps', '16', '--num-minibatches', '2',"
            f" '--total-timesteps', '64', '--output-dir', r'{tmp_path}']))\n")
    run_python(code)


# --- the telemetry layer's own imports (they start a process: not in the unit tier) ---


def test_tensorboard_files_need_no_tensorboard_package(tmp_path):
    # a None entry in sys.modules makes `import tensorboard` raise ImportError
    code = ("import sys; sys.modules['tensorboard'] = None\n"
            "from distppo.telemetry.tensorboard import TensorBoardWriter\n"
            f"tb = TensorBoardWriter(r'{tmp_path}')\n"
            "tb.add_hparams_text({'seed': 1})\n"
            "tb.close()\n")
    run_python(code)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    text = ea.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
    assert text == "|param|value|\n|-|-|\n|seed|1|"

def test_metrics_is_ray_free_and_light():
    code = ("import sys, distppo.telemetry.schema, distppo.telemetry.parquet, "
            "distppo.telemetry.tensorboard, distppo.telemetry.stats, distppo.telemetry.progress; "
            "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"
