#!/usr/bin/env bash
# Submit a distppo sweep to a running Ray cluster as a Ray job and return at once.
#
#   export RAY_ADDRESS=http://127.0.0.1:8265       # the cluster's job server, see below
#   launch/submit_job.sh --games atari57 --seeds 1 2 3 --storage s3://YOUR-BUCKET/sweeps \
#       --name atari57-ppo --total-timesteps 10000000
#
# Run it from the repository root. It runs
#   ray job submit --no-wait --submission-id <JOB_ID> --working-dir . -- distppo sweep <args>
# and prints the commands that follow the job's logs, show its status and stop it.
#
# --working-dir . uploads this checkout (what .gitignore and .rayignore exclude stays here:
# .venv, runs/, sweeps/) and the job imports distppo from it, so the code that runs is the
# code you see; the cluster's nodes only need distppo's dependencies installed.
#
# Environment:
#   RAY_ADDRESS   required: the job server (dashboard) of the cluster, reached through a tunnel,
#                 never through a public port: `ray dashboard cluster/aws-gpu.yaml` (SSH),
#                 `kubectl port-forward svc/<cluster>-head-svc 8265`, or `ssh -L 8265:...`
#   RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH (or the token in ~/.ray/auth_token): the
#                 cluster's token (docs/cluster.md, "Security"); never put it in a file here
#   JOB_ID        the submission id (default: distppo-sweep-<UTC time>); ids are unique per cluster
#   RAY           the ray executable (default: ray)
set -euo pipefail

if [[ $# -eq 0 || "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
if [[ -z "${RAY_ADDRESS:-}" ]]; then
    echo "submit_job.sh: error: set RAY_ADDRESS to the cluster's job server, e.g." \
        "http://127.0.0.1:8265 after 'ray dashboard cluster/aws-gpu.yaml'" >&2
    exit 2
fi

ray_bin="${RAY:-ray}"
job_id="${JOB_ID:-distppo-sweep-$(date -u +%Y%m%d-%H%M%S)}"

# Ray runs the entrypoint through /bin/sh: each argument goes in single quotes (a quote inside
# becomes '\''), so `&`, `;` or `$(...)` in an argument (an s3 URI's query, a --name) stay
# text, and `exec` makes distppo the job's process, which gets Ray's stop signal itself.
entrypoint="exec distppo sweep"
for arg in "$@"; do
    entrypoint+=" '${arg//\'/\'\\\'\'}'"
done
"$ray_bin" job submit --no-wait --submission-id "$job_id" --working-dir . -- "$entrypoint"

cat <<EOF

submitted job: $job_id   (cluster: $RAY_ADDRESS)
follow logs:   ray job logs --follow $job_id     # Ctrl-C stops following, not the job
status:        ray job status $job_id
stop:          ray job stop $job_id     # checkpoints stay; the same sweep args plus --resume continue it
EOF
