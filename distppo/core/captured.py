"""--cuda-graphs: the feedforward policy step and PPO's minibatch step as captured CUDA graphs.

CapturedPolicyStep, for a runner that acts on a GPU.

An eager step launches a few dozen small kernels per env step and syncs the host twice (the
multinomial draw on the host, the results back); at 8 envs the launches, not the math, set the
step time. Captured once, a step is: copy the observations into a pinned buffer, one graph
replay (network, value, a Gumbel-max draw from the graph's own random stream, log-prob), one
copy of the results into pinned memory and one sync. Nothing is allocated per step.

Opt-in and on no default path: a run's numbers are not CleanRL's, and where it has run is in
docs/benchmarks.md ("GPU"). The draw uses its own random stream, so its actions differ from the
eager step's but follow the same distribution (`gumbel_sample`, tested on the CPU); given the same
noise the captured step equals the eager one (`tests/integration/test_captured.py`, marked `gpu`).

CapturedStep, for a learner on a GPU: the step core/update.update() runs for each minibatch
(forward, loss, backward, clipping, Adam) as one graph replay; the host only picks the
minibatch rows.
"""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions import Distribution

from distppo.config import TrainConfig
from distppo.core.models import LSTMAgent, gumbel_sample, preprocess
from distppo.core.update import FlatBatch, minibatch_step

WARMUP_STEPS = 3  # eager runs on a side stream before capture, as CUDA graph capture requires


class CapturedPolicyStep:
    """`step(obs)` -> (action [N] long, logprob [N], value [N, 1]) on the CPU, for obs
    [N, *obs_shape] in the env's dtype; the agent's weights are read in place at every replay,
    so a weight update (`load_state_dict`, an optimizer step) needs no new capture."""

    def __init__(self, agent: torch.nn.Module, obs: np.ndarray, seed: int | None = None):
        if isinstance(agent, LSTMAgent):
            raise ValueError("the captured policy step is for the feedforward agent only")
        self.agent = agent
        self.device = next(agent.parameters()).device
        if self.device.type != "cuda":
            raise ValueError(f"a captured policy step needs the agent on CUDA, not {self.device}")
        n = obs.shape[0]
        self.host_obs = torch.empty(obs.shape, dtype=torch.from_numpy(obs).dtype,
                                    pin_memory=True)                    # [N, *obs_shape]
        self.obs = torch.empty(obs.shape, dtype=self.host_obs.dtype, device=self.device)
        self.host_out = torch.empty((n, 3), dtype=torch.float32, pin_memory=True)
        # graph replays draw from the device's default generator (the one a CUDA graph
        # advances on every replay); the runner's own CPU stream is left untouched. None: the
        # caller seeded it (several captured steps of one runner share it)
        if seed is not None:
            torch.cuda.manual_seed(seed)
        self.host_obs.numpy()[...] = obs
        self.obs.copy_(self.host_obs)
        with torch.no_grad(), side_stream(self.device):
            for _ in range(WARMUP_STEPS):
                self._forward()
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.out, self.uniform = self._forward()  # static outputs, overwritten per replay

    def _forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, 3] (action, logprob, value) and the uniform noise [N, A] the draw used."""
        # not get_action_and_value: Categorical checks its arguments on the host, which a
        # graph capture refuses
        logits, value = self.agent.heads(preprocess(self.obs, self.agent.channels_last))
        uniform = torch.rand(logits.shape, device=logits.device)        # [N, A]
        action = gumbel_sample(logits, uniform)                         # [N]
        logprob = torch.log_softmax(logits, dim=-1).gather(1, action[:, None]).squeeze(1)
        return torch.stack([action.float(), logprob, value.squeeze(1)], dim=1), uniform

    @torch.no_grad()
    def step(self, obs: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.host_obs.numpy()[...] = obs
        self.obs.copy_(self.host_obs, non_blocking=True)
        self.graph.replay()
        self.host_out.copy_(self.out, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        out = self.host_out.clone()  # the pinned buffer is overwritten by the next step
        return out[:, 0].long(), out[:, 1], out[:, 2:3]


class CapturedStep:
    """The minibatch step of core/update.update() for the feedforward agent as one replay of a
    captured graph, on static buffers: start() copies the rollout into a FlatBatch allocated
    once, each step the minibatch's rows into a static index, and the step (minibatch_step
    itself: the same ops) leaves its stats on the device. update()'s loop is unchanged: the
    shuffle is the learner's numpy stream, so the minibatches are the same; Adam is torch's
    capturable one (lr a device tensor), equal to the eager Adam within float rounding.

    capture=False runs the same buffers, warm-up and restore without a graph: on the CPU it is
    bit-equal to update()'s eager step (tests/unit/test_captured_update.py), which a GPU run
    then has to match within rounding (tests/integration/test_captured.py, marked `gpu`)."""

    def __init__(self, agent: nn.Module, optimizer: optim.Optimizer, cfg: TrainConfig,
                 capture: bool = True):
        if isinstance(agent, LSTMAgent):
            raise ValueError("the captured update is for the feedforward agent only")
        if capture and not optimizer.defaults.get("capturable"):
            raise ValueError("a captured update needs an optimizer made with capturable=True")
        self.agent, self.optimizer, self.cfg, self.capture = agent, optimizer, cfg, capture
        self.b: FlatBatch | None = None     # static copy of the iteration's flat batch
        self.mb_inds: torch.Tensor | None = None  # [MB] long, static minibatch rows
        self.stats: dict = {}               # the step's stats, 0-d device tensors
        self.graph: torch.cuda.CUDAGraph | None = None

    def reset(self) -> None:
        """Forget the graph and its buffers (the optimizer's state tensors were replaced, as
        load_state_dict does): the next update captures again."""
        self.b, self.mb_inds, self.stats, self.graph = None, None, {}, None

    def start(self, b: FlatBatch) -> FlatBatch:
        """The static batch, holding this iteration's rollout (built and captured at the
        first iteration)."""
        if self.b is None:
            self._build(b)
        else:
            for f in TENSORS:
                getattr(self.b, f).copy_(getattr(b, f))
        return self.b

    def __call__(self, b: FlatBatch, mb_inds: np.ndarray, mbenvinds: None) -> dict:
        """One replay on rows mb_inds [MB]; the stats stay on the device (the static ones are
        overwritten by the next replay: clipfrac, which update() keeps, is copied)."""
        self.mb_inds.copy_(torch.from_numpy(mb_inds))
        if self.graph is not None:
            self.graph.replay()
        else:
            self.stats = minibatch_step(self.agent, self.optimizer, self.b, self.mb_inds, None,
                                        self.cfg, None, None)
        return dict(self.stats, clipfrac=self.stats["clipfrac"].clone())

    def _build(self, b: FlatBatch) -> None:
        """Static buffers from the first batch; warm-up steps (as capture requires) whose
        changes to the weights and Adam's state are then undone; the capture."""
        assert b.b_valid is None and b.initial_lstm_state is None
        self.b = dataclasses.replace(b, **{f: getattr(b, f).clone() for f in TENSORS})
        self.mb_inds = torch.arange(self.cfg.minibatch_size, device=b.b_obs.device)
        params = [q.detach().clone() for q in self.agent.parameters()]
        state = {q: {k: v.clone() for k, v in s.items()} for q, s in self.optimizer.state.items()}
        with no_validation(), side_stream(b.b_obs.device):
            for _ in range(WARMUP_STEPS):
                minibatch_step(self.agent, self.optimizer, self.b, self.mb_inds, None, self.cfg,
                               None, None)
        with torch.no_grad():
            for q, saved in zip(self.agent.parameters(), params):
                q.copy_(saved)
            for q, s in self.optimizer.state.items():  # in place: the graph reads these
                for k, v in s.items():
                    if q in state:
                        v.copy_(state[q][k])
                    else:
                        v.zero_()  # a fresh Adam's moments and step count
        self.optimizer.zero_grad()
        if self.capture:
            self.graph = torch.cuda.CUDAGraph()
            with no_validation(), torch.cuda.graph(self.graph):
                self.stats = minibatch_step(self.agent, self.optimizer, self.b, self.mb_inds,
                                            None, self.cfg, None, None)


TENSORS = ("b_obs", "b_logprobs", "b_actions", "b_dones", "b_advantages", "b_returns",
           "b_values")  # the FlatBatch fields of the feedforward agent, copied per iteration


@contextlib.contextmanager
def no_validation():
    """Distribution argument checks off: they read values on the host, which a capture
    refuses; they change no number."""
    before = Distribution._validate_args
    Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(before)


@contextlib.contextmanager
def side_stream(device: torch.device):
    """CUDA: run the block on a side stream that the current one then waits for, as warm-up
    before a capture requires; elsewhere nothing."""
    if device.type != "cuda":
        yield
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        yield
    torch.cuda.current_stream().wait_stream(side)
