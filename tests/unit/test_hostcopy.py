"""to_host (core/hostcopy.py) and the optimizer state's form at a resume (core/learner.py
in_form_of): a checkpoint saved eager loads into a --cuda-graphs learner and the reverse."""
from collections import namedtuple
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.optim as optim

from distppo.core.hostcopy import to_host
from distppo.core.learner import in_form_of
from distppo.core.rollout import RolloutBatch, RolloutMeta

Pair = namedtuple("Pair", "a b")


@dataclass(frozen=True)
class Held:
    tensor: torch.Tensor
    label: str


def test_host_values_pass_through_uncopied():
    batch = RolloutBatch(obs=np.zeros((2, 3, 4), np.uint8), actions=np.zeros((2, 3), np.int64),
                         logprobs=np.zeros((2, 3), np.float32),
                         values=np.zeros((2, 3), np.float32),
                         rewards=np.zeros((2, 3), np.float32), dones=np.zeros((2, 3), bool),
                         next_value=np.zeros(3, np.float32), next_done=np.zeros(3, bool))
    tree = {"w": torch.ones(2), "stats": {"loss": 0.5}, "pair": Pair(1, torch.zeros(1)),
            "batch": batch, "meta": RolloutMeta(2, 3), "held": Held(torch.ones(1), "x")}
    out = to_host(tree)
    assert out is tree  # nothing on a device: not even the containers are rebuilt
    assert to_host((batch.meta, batch))[1] is batch


def test_meta_tensors_show_every_container_is_walked():
    """The meta device is one more non-CPU device a CPU-only torch has; its tensors have no
    data, so a copy fails: where to_host reaches a tensor, the error says it got there."""
    meta = torch.empty(2, device="meta")
    for tree in ({"a": [meta]}, (1, meta), Pair(meta, 2), Held(meta, "x"), [{"b": (meta,)}]):
        try:
            to_host(tree)
        except NotImplementedError:
            continue
        raise AssertionError(f"to_host did not reach the tensor in {tree!r}")


def _adam(capturable: bool, lr) -> tuple[torch.nn.Linear, optim.Adam]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, optim.Adam(model.parameters(), lr=lr, eps=1e-5, capturable=capturable)


def _stepped_eager_state() -> dict:
    model, opt = _adam(False, 2.5e-4)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return opt.state_dict()


def test_an_eager_checkpoint_loads_into_a_capturable_adam():
    saved = _stepped_eager_state()
    _, opt = _adam(True, torch.tensor(2.5e-4))
    opt.load_state_dict(in_form_of(opt, saved))
    group = opt.param_groups[0]
    assert group["capturable"] is True  # torch alone would take the saved False
    assert group["lr"] == 2.5e-4 and not torch.is_tensor(group["lr"])
    for state in opt.state.values():  # capturable: the step on the params' device, float32
        assert state["step"].dtype == torch.float32 and float(state["step"]) == 1.0


def test_a_capturable_checkpoint_loads_into_an_eager_adam():
    saved = _stepped_eager_state()
    saved["param_groups"][0].update(capturable=True, lr=torch.tensor(1e-4))
    _, opt = _adam(False, 2.5e-4)
    opt.load_state_dict(in_form_of(opt, saved))
    group = opt.param_groups[0]
    assert group["capturable"] is False
    assert group["lr"] == pytest.approx(1e-4) and not torch.is_tensor(group["lr"])
    for state in opt.state.values():
        assert state["step"].device.type == "cpu" and float(state["step"]) == 1.0
