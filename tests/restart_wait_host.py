"""A Ray job's driver for test_distributed.py: a RayRuntime with one env runner samples
rollouts while the test kills the runner and then its restart, held in its constructor
(DISTPPO_FAULT_PAUSE=<dir>:runner_init@1). Each fault the runtime counts is one line in
<dir>/counted, written the moment it is counted; <dir>/stop ends the run."""
import os
import sys

import ray

from distppo.config import TrainConfig
from distppo.testing import faults


def main() -> None:
    folder = sys.argv[1]
    ray.init(address=os.environ["RAY_ADDRESS"], namespace="distppo-tests",
             runtime_env={"env_vars": faults.forwarded_env()})
    from distppo.distributed.runtime import RayRuntime

    def counted(kind: str, n: int = 1, detail: str = "") -> None:
        with open(os.path.join(folder, "counted"), "a") as f:
            f.write(f"{kind} {n}\n")

    cfg = TrainConfig().replace(env_id="CartPole-v1", backend="gym", num_envs=2, num_steps=16,
                                num_minibatches=2, update_epochs=1, total_timesteps=10 * 32,
                                num_env_runners=1, runner_cpus=0.5, learner_cpus=0.5,
                                output_dir=folder)
    runtime = RayRuntime(cfg, on_fault=counted)
    with open(os.path.join(folder, "runner_pid"), "w") as f:
        f.write(str(ray.get(runtime.runners[0].pid.remote())))
    version = 0
    while not os.path.exists(os.path.join(folder, "stop")):
        runtime.finish_rollout(runtime.start_rollout(version))
        version += 1
    runtime.close()


if __name__ == "__main__":
    main()
