"""The feedforward policy step as one captured CUDA graph, for a runner that acts on a GPU.

An eager step launches a few dozen small kernels per env step and syncs the host twice (the
multinomial draw on the host, the results back); at 8 envs the launches, not the math, set the
step time. Captured once, a step is: copy the observations into a pinned buffer, one graph
replay (network, value, a Gumbel-max draw from the graph's own random stream, log-prob), one
copy of the results into pinned memory and one sync. Nothing is allocated per step.

Opt-in and not on any default path: it has not yet run on a GPU (docs/benchmarks.md, "GPU").
The draw uses its own random stream, so its actions differ from the eager step's but follow
the same distribution (`gumbel_sample`, tested on the CPU); given the same noise the captured
step equals the eager one (`tests/integration/test_captured.py`, marked `gpu`).
"""
from __future__ import annotations

import numpy as np
import torch

from distppo.core.models import LSTMAgent, gumbel_sample, preprocess

WARMUP_STEPS = 3  # eager runs on a side stream before capture, as CUDA graph capture requires


class CapturedPolicyStep:
    """`step(obs)` -> (action [N] long, logprob [N], value [N, 1]) on the CPU, for obs
    [N, *obs_shape] in the env's dtype; the agent's weights are read in place at every replay,
    so a weight update (`load_state_dict`, an optimizer step) needs no new capture."""

    def __init__(self, agent: torch.nn.Module, obs: np.ndarray, seed: int):
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
        # advances on every replay); the runner's own CPU stream is left untouched
        torch.cuda.manual_seed(seed)
        self.host_obs.numpy()[...] = obs
        self.obs.copy_(self.host_obs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(WARMUP_STEPS):
                self._forward()
        torch.cuda.current_stream().wait_stream(side)
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
