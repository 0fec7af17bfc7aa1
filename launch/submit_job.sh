#!/usr/bin/env bash
# Submit a distppo sweep to a running Ray cluster as a Ray job and return at once.
#
#   export RAY_ADDRESS=http://127.0.0.1:8265       # the cluster's job server, see below
#   launch/submit_job.sh --games atari57 --seeds 1 2 3 --storage s3://YOUR-BUCKET/sweeps \
#       --name atari57-ppo --total-timesteps 10000000
#
# Run it from the repository root. It does what
#   ray job submit --no-wait --submission-id <JOB_ID> --working-dir . -- distppo sweep <args>
# does, through Ray's Jobs SDK so that each argument reaches distppo as given (quoted for the
# job's /bin/sh), and prints the commands that follow the job's logs, show its status and stop it.
#
# --working-dir . uploads distppo/, launch/ and pyproject.toml of this checkout (.rayignore;
# .gitignore keeps .venv, runs/ and sweeps/ out too) and the job imports distppo from it, so
# the code that runs is the code you see; the cluster's nodes only need distppo's dependencies.
#
# Environment:
#   RAY_ADDRESS   required: the job server (dashboard) of the cluster, reached through a tunnel,
#                 never through a public port: `ray dashboard cluster/aws-gpu.yaml` (SSH),
#                 `kubectl port-forward svc/<cluster>-head-svc 8265`, or `ssh -L 8265:...`
#   RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH (or the token in ~/.ray/auth_token): the
#                 cluster's token (docs/cluster.md, "Security"); never put it in a file here
#   JOB_ID        the submission id (default: distppo-sweep-<UTC time>); ids are unique per cluster
#   PYTHON        the python that has ray installed (default: python)
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

python_bin="${PYTHON:-python}"
job_id="${JOB_ID:-distppo-sweep-$(date -u +%Y%m%d-%H%M%S)}"

# Ray runs a job's entrypoint string with /bin/sh. `ray job submit -- ARGS` builds that string
# with list2cmdline up to Ray 2.5x (double quotes around arguments with spaces only, so `&` in
# an s3 URI's query splits the command and `$(...)` runs) and with shlex.join after. So the
# script submits through Ray's Jobs SDK with a string it quotes itself (shlex.join: single
# quotes), and `exec` makes distppo the job's process, which then gets Ray's stop signal.
"$python_bin" - "$job_id" "$@" <<'PY'
import shlex
import sys

from ray.job_submission import JobSubmissionClient

job_id, args = sys.argv[1], sys.argv[2:]
client = JobSubmissionClient()  # RAY_ADDRESS; token authentication from RAY_AUTH_* as the CLI
client.submit_job(entrypoint="exec " + shlex.join(["distppo", "sweep", *args]),
                  submission_id=job_id, runtime_env={"working_dir": "."})
PY

cat <<EOF

submitted job: $job_id   (cluster: $RAY_ADDRESS)
follow logs:   ray job logs --follow $job_id     # Ctrl-C stops following, not the job
status:        ray job status $job_id
stop:          ray job stop $job_id     # checkpoints stay; the same sweep args plus --resume continue it
EOF
