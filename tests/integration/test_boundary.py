"""Nothing that leaves a learner or an env runner holds a device tensor (core/hostcopy.py,
distributed/boundary.py). Without a GPU the other device is torch's lazy tensor device, whose
TorchScript backend ships with every torch build: a real non-CPU device, whose tensors a
process that never initialised it cannot hold either."""
import ast
from pathlib import Path

import numpy as np
import pytest
import torch

import distppo
from distppo.config import TrainConfig
from distppo.core.learner import PPOLearner
from distppo.core.rollout import RolloutBatch
from distppo.distributed.learner import Learner


@pytest.fixture(scope="module")
def lazy() -> torch.device:
    pytest.importorskip("torch._lazy.ts_backend").init()
    return torch.device("lazy")


def small_config() -> TrainConfig:
    # 2 envs x 8 steps, 1 epoch of 2 minibatches
    return TrainConfig().replace(num_envs=2, num_steps=8, num_minibatches=2, update_epochs=1,
                                 total_timesteps=64)


def cpu_batch(cfg: TrainConfig) -> RolloutBatch:
    rng = np.random.default_rng(3)
    t, n = cfg.ppo.num_steps, cfg.env.num_envs
    return RolloutBatch(
        obs=rng.integers(0, 256, (t, n, 4, 84, 84), dtype=np.uint8),
        actions=rng.integers(0, 4, (t, n)), logprobs=np.full((t, n), -1.4, np.float32),
        values=rng.standard_normal((t, n)).astype(np.float32),
        rewards=(rng.random((t, n)) < 0.3).astype(np.float32), dones=rng.random((t, n)) < 0.1,
        next_value=np.zeros(n, np.float32), next_done=np.zeros(n, dtype=bool))


def device_types(tree) -> set:
    """The device types of every tensor in a state tree (dicts, lists, tuples)."""
    if torch.is_tensor(tree):
        return {tree.device.type}
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return set().union(*(device_types(v) for v in tree)) if tree else set()
    return set()


def tensors(tree, prefix="") -> dict:
    if torch.is_tensor(tree):
        return {prefix: tree}
    items = tree.items() if isinstance(tree, dict) else \
        enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    return {k: v for key, sub in items for k, v in tensors(sub, f"{prefix}/{key}").items()}


def on_device(learner: PPOLearner, device: torch.device) -> None:
    """Move a learner's model and Adam state to `device`, as a GPU learner holds them."""
    learner.agent.to(device)  # the same Parameter objects: the optimizer's keys stay valid
    for state in learner.optimizer.state.values():
        for name, value in state.items():
            state[name] = value.to(device)
    learner.device = device


def test_every_ray_actor_class_is_a_host_only_shell():
    """An actor class added later without the decorator fails here, not on a CPU-only node."""
    remote, decorated = set(), set()
    for path in Path(distppo.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "ray.remote":
                remote.update(ast.unparse(a) for a in node.args if isinstance(a, ast.Name))
            if isinstance(node, ast.ClassDef):
                names = {ast.unparse(d) for d in node.decorator_list}
                if "ray.remote" in names:
                    remote.add(node.name)
                if "host_only" in names:
                    decorated.add(node.name)
    assert remote >= {"Learner", "EnvRunner"}
    assert remote <= decorated, f"actor classes without @host_only: {remote - decorated}"


def test_a_learner_on_another_device_hands_over_cpu_tensors(lazy):
    cfg = small_config()
    core = PPOLearner(cfg, (4, 84, 84), 4, seed=1)
    core.update(cpu_batch(cfg), iteration=1)  # Adam's state exists after one step
    on_device(core, lazy)
    shell = Learner.__new__(Learner)  # the actor's class, without Ray's process around it
    shell.core = core

    held = getattr(Learner.state_dict, "__wrapped__", Learner.state_dict)(shell)  # its own
    assert device_types(held) == {"lazy"}
    handed = shell.state_dict()
    assert device_types(handed) == {"cpu"}
    want = tensors(held)
    got = tensors(handed)
    assert got.keys() == want.keys() and len(got) > 20
    for key, value in got.items():
        assert torch.equal(value, want[key].cpu()), key
    assert device_types(shell.get_weights()) == {"cpu"}

    # and a learner in a process that never saw that device loads it as it was
    fresh = PPOLearner(cfg, (4, 84, 84), 4, seed=2)
    fresh.load_state_dict(handed)
    for key, value in fresh.agent.state_dict().items():
        assert torch.equal(value, handed["model"][key]), key
    assert fresh.rng.bit_generator.state == core.rng.bit_generator.state
    assert np.isclose(float(fresh.optimizer.param_groups[0]["lr"]),
                      float(core.optimizer.param_groups[0]["lr"]))
