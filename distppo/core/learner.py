"""PPOLearner: the plain object that owns the agent, the optimizer and the minibatch RNG, and
runs the update (core/update.py; --cuda-graphs: core/captured.py's CapturedStep). No Ray: the
local backend calls it directly, the Learner actor (distributed/learner.py) forwards to it."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch
import torch.optim as optim

from distppo.config import TrainConfig
from distppo.core.captured import CapturedStep
from distppo.core.models import make_agent
from distppo.core.rollout import RolloutBatch
from distppo.core.seeds import CleanRLShuffle, set_torch_deterministic
from distppo.core.shards import ShardPool
from distppo.core.update import GradAllReduce, resolve_device, update
from distppo.errors import ConfigError
from distppo.placement.shards import ShardPlan, shard_plan


class PPOLearner:
    """Owns the agent, the optimizer and the minibatch RNG; plain Python, no Ray."""

    def __init__(self, cfg: TrainConfig, obs_shape: tuple, num_actions: int, seed: int,
                 rank: int = 0, shards: Optional[ShardPlan] = None):
        """shards: the gradient slices resolve() gave this learner (placement/resolve.py);
        None, for a learner made on its own (a test, a debugger): sized here for this
        process's torch threads."""
        self.cfg = cfg
        self.device = resolve_device(cfg.learner.device, cfg.learner.cuda)
        if cfg.learner.amp != "off" and self.device.type != "cuda":
            raise ConfigError(f"--amp {cfg.learner.amp} needs the learner on a GPU and it runs "
                              f"on {self.device}: drop --amp")
        graphs = cfg.learner.cuda_graphs
        if graphs and self.device.type != "cuda":
            raise ConfigError(f"--cuda-graphs needs the learner on a GPU and it runs on "
                              f"{self.device}: drop --cuda-graphs")
        set_torch_deterministic(cfg.torch_deterministic)  # this process's (a Ray learner's)
        torch.manual_seed(seed)  # same seed on every learner: identical initial weights
        self.agent = make_agent(cfg.ppo.algo, obs_shape, num_actions,
                                cfg.learner.channels_last,
                                cfg.learner.fused_lstm).to(self.device)
        if cfg.learner.compile:
            # the bound method, not the module: state_dict keys stay CleanRL's names
            self.agent.get_action_and_value = torch.compile(self.agent.get_action_and_value)
        # --cuda-graphs: Adam's capturable form, which reads its step count and lr from device
        # tensors (capturable=False is Adam's default: CleanRL's optimizer)
        lr = torch.tensor(cfg.ppo.learning_rate, device=self.device) if graphs \
            else cfg.ppo.learning_rate
        self.optimizer = optim.Adam(self.agent.parameters(), lr=lr, eps=1e-5, capturable=graphs)
        self.captured = CapturedStep(self.agent, self.optimizer, cfg) if graphs else None
        # rank r shuffles with seed + r, as CleanRL; --exact-replay: np.random.shuffle's stream
        self.rng = (CleanRLShuffle(seed) if cfg.ppo.exact_replay
                    else np.random.default_rng(seed + rank))
        self.rank = rank
        self.sync: Optional[GradAllReduce] = None
        if shards is None:
            shards = shard_plan(cfg, torch.get_num_threads(), self.device.type == "cpu")
        self.shards = ShardPool(shards)

    def update(self, batch: RolloutBatch, iteration: int, handover_threads: int = 0,
               runners_done: Optional[Callable[[], bool]] = None) -> dict:
        """On this process's torch threads; with `runners_done` (--overlap), on
        `handover_threads` from the first gradient slice after runners_done() says the runners'
        cores are free (the numbers do not change: core/shards.py). The thread count is as
        before afterwards."""
        threads = torch.get_num_threads()
        self.shards.start(threads, handover_threads, runners_done)
        if self.shards.plan.count > 1:  # every op of a sliced update on a slice's threads, so
            torch.set_num_threads(self.shards.plan.intra)  # its numbers never depend on width
        if isinstance(self.rng, CleanRLShuffle):
            self.rng.start_iteration()
        try:
            return update(self.agent, self.optimizer, batch, self.cfg, iteration, self.rng,
                          self.device, self.sync, self.shards, step=self.captured)
        finally:
            torch.set_num_threads(threads)

    def get_weights(self) -> dict:
        """CPU copies of the parameters, for the env runners' policy copies."""
        return {k: v.detach().cpu().clone() for k, v in self.agent.state_dict().items()}

    def state_dict(self) -> dict:
        return {
            "model": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "learner_rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict) -> None:
        self.agent.load_state_dict(state["model"])
        self.optimizer.load_state_dict(in_form_of(self.optimizer, state["optimizer"]))
        if self.captured is not None:
            # the loaded state replaced the tensors the graph reads; the lr comes back as it
            # was saved (a float)
            self.optimizer.param_groups[0]["lr"] = torch.tensor(
                float(self.optimizer.param_groups[0]["lr"]), device=self.device)
            self.captured.reset()
        self.rng.bit_generator.state = state["learner_rng"]  # checkpoints hold rank 0's stream
        if self.rank:  # other ranks derive theirs from it, deterministically and distinct per rank
            self.rng = np.random.default_rng([self.rank, int(self.rng.integers(2**62))])


def in_form_of(optimizer: optim.Optimizer, saved: dict) -> dict:
    """`saved` (an optimizer state dict) in the form `optimizer` runs in, whichever form it was
    saved in: --cuda-graphs may be turned on or off at a resume. Optimizer.load_state_dict takes
    `capturable` from the saved param groups and places Adam's `step` by it (on the params'
    device when capturable, else as saved), so a capturable optimizer loaded from an eager
    checkpoint would keep CPU steps that a captured step cannot read. The lr is saved as a
    float: a capturable learner turns it back into a device tensor after loading."""
    capturable = bool(optimizer.defaults.get("capturable", False))
    groups = [dict(group, capturable=capturable, lr=float(group["lr"]))
              for group in saved["param_groups"]]
    state = saved["state"]
    if not capturable:  # an eager Adam keeps its step counts on the CPU
        state = {k: {n: v.cpu() if n == "step" and torch.is_tensor(v) else v
                     for n, v in s.items()} for k, s in state.items()}
    return {**saved, "state": state, "param_groups": groups}
