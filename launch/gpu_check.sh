#!/usr/bin/env bash
# GPU check: `distppo bench` on a CUDA machine, the learner on the GPU
# (--learner-gpus auto gives it one), one to several env runners; prints SPS and per-phase
# seconds per variant and the minutes 10M Breakout steps would take at that SPS.
#
#   bash launch/gpu_check.sh                  # defaults below; about 7 minutes on one GPU
#   STEPS=204800 REPEATS=3 RUNNERS=8 BACKEND=ale bash launch/gpu_check.sh
#
# Each variant is its own bench (a failed or slow one costs only itself: PER_RUN_S each, and
# variants not started by BUDGET_S are skipped), one table that grows a row as each variant is
# measured (OUT_MD; default $OUT/gpu_check.md where $OUT is set, else ./gpu_check.md), with
# the gpu-marked tests' result and any failed variant beside it. BACKEND=ale is
# for machines without EnvPool wheels (the same Atari settings through ale-py's vector env).
# Paste the table, the GPU line and the command into docs/benchmarks.md ("GPU").
#
# A machine without a package index: build the wheels here (`python launch/gpu_bundle.py`:
# .gpu-bundle/part1/ holds what a torch image lacks, ~56 MiB; further parts what such images
# usually have) and carry the parts it needs; the script installs what the machine lacks of
# every carried part into $SITE and puts it on PYTHONPATH. A part per call: carry part1 with the
# command below, or more parts in earlier calls on the same warm machine (a call that runs
# `python3 launch/gpu_bundle.py --install .gpu-bundle --target /tmp/site` alone).
set -uo pipefail
PYTHON=${PYTHON:-python}
SITE=${SITE:-/tmp/site}
if ls .gpu-bundle/part*/*.whl > /dev/null 2>&1; then
  "$PYTHON" launch/gpu_bundle.py --install .gpu-bundle --target "$SITE" || exit 1
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
BACKEND=${BACKEND:-envpool}
STEPS=${STEPS:-40960}      # 40 iterations of CleanRL's 8 x 128
REPEATS=${REPEATS:-1}
RUNNERS=${RUNNERS:-4}
PER_RUN_S=${PER_RUN_S:-150}
BUDGET_S=${BUDGET_S:-420}
# The table grows a row as each variant is measured, so a run cut short keeps what it had; on
# the lent device machine it lands in $OUT, the folder that comes back.
MD=${OUT_MD:-${OUT:+$OUT/}gpu_check.md}

"$PYTHON" - <<'PY' || exit 1
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device; nothing to check")
p = torch.cuda.get_device_properties(0)
print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)")
PY
echo "CPU cores: $(nproc); backend: $BACKEND; steps per run: $STEPS; repeats: $REPEATS"

# The gpu-marked tests first (the captured policy step against the eager one): the CPU suite
# cannot run the GPU-only paths, so only a real GPU checks them. --noconftest: the suite's conftest
# needs the test extra, which a bare GPU machine lacks; these tests need only torch and numpy.
if "$PYTHON" -c "import pytest" 2>/dev/null; then
  timeout -k 10 300 "$PYTHON" -m pytest -q -p no:cacheprovider --noconftest -o addopts="" \
    -m gpu tests/integration/test_captured.py 2>&1 | tail -n 15 | tee "${MD%.md}.gpu_tests.txt"
else
  echo "gpu tests: skipped, pytest is not installed for $PYTHON" | tee "${MD%.md}.gpu_tests.txt"
fi

# Rollout only (no learning), the policy on the GPU: the CleanRL loop, the Sampler, the grouped
# rollout, and both captured; with the share of the wall-clock in which the envs are stepping.
if [ "$BACKEND" = envpool ]; then
  timeout -k 10 180 "$PYTHON" launch/rollout_bench.py --device cuda --iterations 20 \
    --repeats 1 --out "${MD%.md}.rollout.md" 2>&1 | tail -n 8
fi

# What runs where, from the defaults alone (the first line of `distppo train`).
tmp=$(mktemp -d)
timeout -k 10 "$PER_RUN_S" "$PYTHON" -m distppo train --env-id Breakout-v5 --backend "$BACKEND" \
  --total-timesteps 2048 --output-dir "$tmp/smoke" --log-every 1000 2>&1 | head -3

# The CleanRL-mode baseline first (one process, threads = cores, every speed option off, the
# learner on CUDA as CleanRL's scripts put it), then distppo's paths; the learner is on CUDA in
# every one (--device auto). --cuda-graphs captures the update (and with --runner-device cuda the
# policy step); the last variants also act on the GPU or compile the update.
variants=(
  "baseline=--local --device cuda --num-threads $(nproc) --no-channels-last --omp-spincount default"
  "local=--local"
  "local-graphs=--local --cuda-graphs"
  "local-runner-graphs=--local --runner-device cuda --cuda-graphs"
  "runner-graphs-groups2=--num-env-runners 1 --runner-device cuda --cuda-graphs --env-groups 2"
  "ray="
  "ray-${RUNNERS}runners=--num-env-runners $RUNNERS"
  "local-groups2=--local --env-groups 2"
  "runner-cuda-groups2=--num-env-runners 1 --runner-device cuda --env-groups 2"
  "ray-${RUNNERS}runners-overlap=--num-env-runners $RUNNERS --overlap"
  "ray-8runners-overlap=--num-env-runners 8 --overlap"
  "overlap-bf16=--num-env-runners $RUNNERS --overlap --amp bf16"
  "overlap-runners-cuda=--num-env-runners $RUNNERS --overlap --runner-device cuda"
  "overlap-compile=--num-env-runners $RUNNERS --overlap --compile"
)
start=$SECONDS
: > "$tmp/rows"; : > "$tmp/header"
for v in "${variants[@]}"; do
  name=${v%%=*}
  if (( SECONDS - start > BUDGET_S )); then echo "skipped (budget): $name"; continue; fi
  if timeout -k 10 "$PER_RUN_S" "$PYTHON" -m distppo bench --env-id Breakout-v5 \
      --backend "$BACKEND" --algo ppo --total-timesteps "$STEPS" --repeats "$REPEATS" \
      --variant "$v" --out "$tmp/$name.md" > "$tmp/$name.log" 2>&1; then
    [ -s "$tmp/header" ] || head -n 2 "$tmp/$name.md" > "$tmp/header"
    grep '^| ppo ' "$tmp/$name.md" >> "$tmp/rows"
    tail -n 1 "$tmp/$name.md"
    cat "$tmp/header" "$tmp/rows" > "$MD"
  else
    echo "FAILED ($name, rc $?): $(tail -n 2 "$tmp/$name.log" | tr '\n' ' ')" | tee -a "${MD%.md}.failed.txt"
  fi
done

echo; cat "$MD" 2>/dev/null; echo
"$PYTHON" - "$MD" <<'PY'
import os
import sys
lines = open(sys.argv[1]).readlines() if os.path.exists(sys.argv[1]) else []
rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines]
rows = [r for r in rows if len(r) > 3 and r[0] == "ppo"]
base = float(rows[0][2].replace(",", "")) if rows and rows[0][1] == "baseline" else None
for cells in rows:
    sps = float(cells[2].replace(",", ""))
    ratio = f"  {sps / base:4.2f}x baseline" if base else ""
    print(f"{cells[1]:24s} {sps:8,.0f} SPS -> 10M steps in {1e7 / sps / 60:6.1f} min{ratio}")
PY

# Sweep packing (docs/benchmarks.md "Sweep packing"): PACK trials at once on this node, each a
# --local run on its own NPROC/PACK cores with the learner on the shared GPU, against one such
# run with every core; the aggregate SPS is what --trials-per-node auto bets on.
PACK=${PACK:-4}
if (( SECONDS - start > BUDGET_S )); then
  echo "skipped (budget): packed x$PACK"
else
  per=$(( $(nproc) / PACK ))
  pack_run() {  # name cores threads
    timeout -k 10 "$PER_RUN_S" taskset -c "$2" "$PYTHON" -m distppo train --local \
      --env-id Breakout-v5 --backend "$BACKEND" --total-timesteps "$STEPS" --num-threads "$3" \
      --output-dir "$tmp/pack" --run-name "$1" --log-every 100000 > "$tmp/$1.log" 2>&1
  }
  last_sps() {  # the run's last row's SPS
    "$PYTHON" -c "import pandas, sys; print(round(pandas.read_parquet(sys.argv[1])['sps'].iloc[-1]))" \
      "$tmp/pack/$1/metrics.parquet" 2>/dev/null || echo 0
  }
  pack_run alone "0-$(( $(nproc) - 1 ))" "$(nproc)"
  alone=$(last_sps alone)
  for i in $(seq 0 $(( PACK - 1 ))); do
    pack_run "packed$i" "$(( i * per ))-$(( i * per + per - 1 ))" "$per" &
  done
  wait
  total=0
  for i in $(seq 0 $(( PACK - 1 ))); do total=$(( total + $(last_sps "packed$i") )); done
  echo "packing: 1 run on $(nproc) cores $alone SPS; $PACK runs of $per cores on one GPU, " \
       "$total SPS together"
  echo "| packing | 1 x $(nproc) cores: $alone SPS | $PACK x $per cores: $total SPS |" >> "$MD"
  # the same packed runs with NVIDIA MPS, where the machine lets its daemon start: the
  # trials' kernels then share the GPU at once instead of by time slices
  export CUDA_MPS_PIPE_DIRECTORY=$tmp/mps CUDA_MPS_LOG_DIRECTORY=$tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if (( SECONDS - start > BUDGET_S + PER_RUN_S )); then
    echo "skipped (budget): packed x$PACK with MPS"
  elif command -v nvidia-cuda-mps-control > /dev/null && nvidia-cuda-mps-control -d; then
    for i in $(seq 0 $(( PACK - 1 ))); do
      pack_run "mps$i" "$(( i * per ))-$(( i * per + per - 1 ))" "$per" &
    done
    wait
    echo quit | nvidia-cuda-mps-control
    mps=0
    for i in $(seq 0 $(( PACK - 1 ))); do mps=$(( mps + $(last_sps "mps$i") )); done
    echo "packing with MPS: $PACK runs of $per cores, $mps SPS together"
    echo "| packing, MPS | | $PACK x $per cores: $mps SPS |" >> "$MD"
  else
    echo "packing with MPS: skipped, no MPS daemon here" | tee -a "$MD"
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
rm -rf "$tmp"
