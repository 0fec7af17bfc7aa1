"""A Ray job's driver for test_distributed.py: a detached actor of this job trains a run on the
Ray runtime (a real learner actor, held in its third update by DISTPPO_FAULT_PAUSE), as a
sweep's trial does. A detached actor outlives its job's end, so the test can end the job (it
SIGKILLs this driver) and then kill the learner while the trainer still runs: exactly what a
trial sees when the teardown of its driver's job kills its learner first."""
import json
import os
import sys
import threading
import time

import ray

from distppo.config import TrainConfig
from distppo.testing import faults


@ray.remote(num_cpus=0)
class Host:
    def __init__(self) -> None:
        self.outcome = None

    def start(self, cfg: TrainConfig) -> None:
        from distppo.core.loop import train
        from distppo.distributed.factory import make_runtime

        def work() -> None:
            try:
                train(cfg, make_runtime, progress=False)
                self.outcome = "finished"
            except BaseException as exc:  # noqa: BLE001 - the test reads which one
                self.outcome = type(exc).__name__
        threading.Thread(target=work, daemon=True).start()

    def result(self):
        return self.outcome


def main() -> None:
    out, name = sys.argv[1], sys.argv[2]
    ray.init(address=os.environ["RAY_ADDRESS"], namespace="distppo-tests",
             runtime_env={"env_vars": faults.forwarded_env()})
    cfg = TrainConfig().replace(env_id="CartPole-v1", backend="gym", num_envs=2, num_steps=16,
                                num_minibatches=2, update_epochs=1, total_timesteps=20 * 32,
                                num_env_runners=1, runner_cpus=0.5, learner_cpus=0.5,
                                output_dir=out, run_name="hosted")
    host = Host.options(name=name, lifetime="detached").remote()
    ray.get(host.start.remote(cfg))
    print(json.dumps({"job_id": ray.get_runtime_context().get_job_id()}), flush=True)
    time.sleep(600)  # the test SIGKILLs this driver


if __name__ == "__main__":
    main()
