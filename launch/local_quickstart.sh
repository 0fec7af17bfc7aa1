#!/usr/bin/env bash
# The cluster workflow on one machine, start to finish, in about two minutes on 2 CPU cores:
# start a Ray head bound to this machine's loopback (token authentication on), submit a tiny
# sweep with launch/submit_job.sh (`ray job submit --working-dir . -- distppo sweep ...`),
# follow its logs until it ends, print where its Parquet files are, and stop the head.
#
#   launch/local_quickstart.sh                        # the tiny default sweep below
#   launch/local_quickstart.sh --games Pong-v5 --seeds 1 2 --total-timesteps 4096 \
#       --storage "$PWD/sweeps" --name pong          # any `distppo sweep` arguments instead
#
# Run it from the repository root with the virtual environment's bin on PATH (or activated).
# Only the head this script starts is stopped; other Ray instances on the machine are left
# alone (no `ray stop`, which would stop every Ray on the machine).
#
# Environment (defaults in brackets; change them when another Ray uses these ports):
#   RAY_PORT [6379]  DASHBOARD_PORT [8265]  CLIENT_PORT [10001]  AGENT_PORT [52365]
#   NUM_CPUS [2]     RAY                    [ray]
set -euo pipefail

ray_bin="${RAY:-ray}"
ray_port="${RAY_PORT:-6379}"
dashboard_port="${DASHBOARD_PORT:-8265}"
client_port="${CLIENT_PORT:-10001}"
agent_port="${AGENT_PORT:-52365}"
num_cpus="${NUM_CPUS:-2}"

if [[ $# -eq 0 ]]; then
    # 2 iterations of 4 EnvPool envs x 32 steps; half a CPU per bundle so a 2-CPU head fits it.
    set -- --games Breakout-v5 --seeds 1 --num-envs 4 --num-steps 32 --num-minibatches 2 \
        --update-epochs 1 --total-timesteps 256 --trial-cpus 0.5 --runner-cpus 0.5 \
        --learner-cpus 0.5 --storage "$PWD/sweeps" --name "quickstart-$(date -u +%Y%m%d-%H%M%S)"
fi

# A private temp dir holds this head's session files and a token made for this run only.
# A short path: Ray's unix sockets live under it and socket paths are limited to ~100 bytes.
work="$(mktemp -d /tmp/distppo-qs.XXXXXX)"
(umask 077 && python -c 'import secrets; print(secrets.token_hex(32))' > "$work/token")
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$work/token"
export RAY_ADDRESS="http://127.0.0.1:$dashboard_port"

head_pid=""
stop_head() {
    if [[ -n "$head_pid" ]] && kill -0 "$head_pid" 2>/dev/null; then
        echo "stopping the Ray head (pid $head_pid)"
        kill -TERM "$head_pid"   # `ray start --block` stops the processes it started
        wait "$head_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap stop_head EXIT
trap 'exit 130' INT TERM

# --block keeps `ray start` in the foreground of this background job, so its PID owns the head.
"$ray_bin" start --head --block --disable-usage-stats --num-cpus="$num_cpus" --num-gpus=0 \
    --node-ip-address=127.0.0.1 --port="$ray_port" --ray-client-server-port="$client_port" \
    --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port="$dashboard_port" \
    --dashboard-agent-listen-port="$agent_port" --temp-dir="$work/ray" \
    > "$work/head.log" 2>&1 &
head_pid=$!

echo "waiting for the Ray head's job server at $RAY_ADDRESS ..."
for _ in $(seq 120); do
    if "$ray_bin" job list > /dev/null 2>&1; then break; fi
    if ! kill -0 "$head_pid" 2>/dev/null; then
        echo "local_quickstart.sh: error: the Ray head did not start:" >&2
        tail -n 20 "$work/head.log" >&2
        exit 1
    fi
    sleep 1
done

job_id="distppo-quickstart-$(date -u +%Y%m%d-%H%M%S)"
JOB_ID="$job_id" RAY="$ray_bin" "$(dirname "$0")/submit_job.sh" "$@"
"$ray_bin" job logs --follow "$job_id" || true
# `ray job status` logs "Job '<id>' succeeded|failed|stopped" (on stderr).
status="$("$ray_bin" job status --log-color false "$job_id" 2>&1 | grep -Eo "(succeeded|failed|stopped)$" || true)"
echo "job $job_id: ${status:-unknown}"
[[ "$status" == "succeeded" ]]
