#!/usr/bin/env bash
# The GPU device check in one call: the main job end to end and the GPU paths' speed on one
# CUDA machine, all within BUDGET_S seconds (420) counted from this line, installs and tests
# included. Rows, in this order, each added to $OUT/gpu_check.md as it lands:
#   a  a sweep of 2 trials on the GPU (Ray learners, a checkpoint every 2 iterations), stopped
#      by SIGTERM once a trial has its checkpoint of iteration 2, then `--resume`d to the end;
#   b  `distppo train` with every default (Ray, the learner on the GPU);
#   c  one process acting and learning on the GPU, both steps captured (--runner-device cuda
#      --cuda-graphs: on Ray the learner's process acts, --act-in auto);
#   d  the same with --overlap;
#   e  PACK --local trials side by side, each on its share of the cores, the learners on the
#      one GPU; then the same under NVIDIA MPS where its daemon starts;
# then the gpu-marked tests, and with what is left launch/rollout_bench.py on the GPU (the
# share of a rollout in which the envs step). Each row: SPS from the Parquet rows after
# iteration 5 and with them (launch/gpu_check_rows.py). A variant gets what is left of the
# budget, at most its cap; a failed or cut one's whole output is appended to
# $OUT/gpu_check.log, beside this script's own lines.
#
#   PYTHON=python3 bash launch/gpu_check.sh     # the device call, carrying .gpu-bundle/part1
#   bash launch/gpu_check.sh --dry-run          # on CPU: all but c, d, rollout; tiny sizes
#                                               # (the sweep's trials --local), 780 s budget
#
# A machine without a package index: `python launch/gpu_bundle.py` builds the wheels here and
# prints what a call carries (the tree and part1, at most 64 MiB); this script installs what
# the machine lacks of them into $SITE and puts it on PYTHONPATH. ROWS picks rows: "a b c d e
# e-mps tests rollout" (e-mps: row e under MPS).
set -uo pipefail
START=$SECONDS
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "gpu_check: unknown argument '$1': give none, or --dry-run" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python}
BACKEND=${BACKEND:-envpool}
ROWS=${ROWS:-a b c d e e-mps tests rollout}
RESERVE_S=${RESERVE_S:-20}  # kept back for the last rows' reading and the cleanup
GPU_TESTS=${GPU_TESTS:-tests/integration/test_captured.py}
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
MD=$OUT/gpu_check.md
LOG=$OUT/gpu_check.log
tmp=$(mktemp -d)
# each variant's cap in seconds (it gets less where less of the budget is left), and the
# seconds a SIGTERMed sweep has to stop before it is killed
if (( DRY )); then
  # a 2-core CPU, maybe shared, where starting a Ray worker can take a minute
  BUDGET_S=${BUDGET_S:-780}
  A_CAP=${A_CAP:-300}; B_CAP=${B_CAP:-150}; E_CAP=${E_CAP:-150}; TESTS_CAP=${TESTS_CAP:-90}
  PACK=${PACK:-2}
  SITE=${SITE:-}
  # 2 envs x 16 steps, one epoch: 8 iterations of 32 steps in seconds on a CPU; the sweep's
  # trials --local (one Ray worker each, not three), their reservations fitting 2 on 2 cores
  SIZE=(--num-envs 2 --num-steps 16 --num-minibatches 2 --update-epochs 1)
  BATCH=32
  SWEEP_FLAGS=(--local --trial-cpus 0.5)
  STEPS=${STEPS:-$(( 8 * BATCH ))}
  SWEEP_ITERS=${SWEEP_ITERS:-8}
else
  BUDGET_S=${BUDGET_S:-420}
  A_CAP=${A_CAP:-150}; B_CAP=${B_CAP:-75}; E_CAP=${E_CAP:-75}; TESTS_CAP=${TESTS_CAP:-90}
  PACK=${PACK:-4}
  SITE=${SITE:-/tmp/site}
  SIZE=()
  BATCH=1024  # CleanRL's 8 x 128
  SWEEP_FLAGS=()  # Ray learners, on the GPU: their state crosses to the trial at checkpoints
  STEPS=${STEPS:-$(( 30 * BATCH ))}
  SWEEP_ITERS=${SWEEP_ITERS:-20}
fi
C_CAP=${C_CAP:-60}; D_CAP=${D_CAP:-60}; STOP_GRACE_S=${STOP_GRACE_S:-30}

PIDS=()    # children running now: the cleanup ends them
MPS_ON=0
say() { echo "$*" | tee -a "$LOG"; }
left() { echo $(( BUDGET_S - RESERVE_S - (SECONDS - START) )); }
slot() {  # CAP NEED: seconds a step may run (what is left, at most CAP); 0 when under NEED
  local l; l=$(left)
  if (( l < $2 )); then echo 0; elif (( l < $1 )); then echo "$l"; else echo "$1"; fi
}
wanted() { [[ " $ROWS " == *" $1 "* ]]; }

stop_children() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2> /dev/null; done
  for _ in $(seq 20); do
    local alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2> /dev/null && alive=1; done
    (( alive )) || break
    sleep 0.5
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2> /dev/null; done
  PIDS=()
}
start_mps() {
  command -v nvidia-cuda-mps-control > /dev/null || return 1
  export CUDA_MPS_PIPE_DIRECTORY=$tmp/mps CUDA_MPS_LOG_DIRECTORY=$tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  # on before the daemon starts: a signal handled the moment it has started must stop it
  MPS_ON=1
  timeout 20 nvidia-cuda-mps-control -d && return 0
  MPS_ON=0
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  return 1
}
stop_mps() {
  (( MPS_ON )) || return 0
  echo quit | timeout 20 nvidia-cuda-mps-control
  MPS_ON=0
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
cleanup() {
  trap - EXIT INT TERM
  [ -n "${WATCH:-}" ] && kill -TERM "$WATCH" 2> /dev/null
  stop_children
  stop_mps  # after its clients are gone: quit waits for them
  rm -rf "$tmp"
  say "gpu_check: ended after $(( SECONDS - START )) s of its $BUDGET_S s budget"
}
trap cleanup EXIT
trap 'say "gpu_check: interrupted"; exit 130' INT
trap 'say "gpu_check: terminated"; exit 143' TERM
# A backstop: whatever blocks, the script ends by its budget (each step's own timeout is
# clipped to what is left, so this fires only on a bug of the script).
( sleep "$BUDGET_S" & s=$!; trap 'kill $s; exit 0' TERM; wait $s; kill -TERM $$ ) &
WATCH=$!

run() {  # NAME SECONDS COMMAND...: the command for at most SECONDS; RC, WALL; a failure's
  # output goes to the log. Run in the background and waited for, so a signal is handled at once
  local name=$1 secs=$2 t0=$SECONDS; shift 2
  timeout -k 10 "$secs" "$@" > "$tmp/$name.out" 2>&1 &
  PIDS=("$!")
  wait "$!"
  RC=$?
  PIDS=()
  WALL=$(( SECONDS - t0 ))
  (( RC == 0 )) || keep "$name" "$RC"
}
keep() { { echo "=== $1: exit $2 (124: its time ran out) ==="; cat "$tmp/$1.out"; } >> "$LOG"; }
add_row() {  # ROW VARIANT RC WALL PATH...: the row from the runs' Parquet rows
  local line
  line=$(timeout 60 "$PYTHON" launch/gpu_check_rows.py "$@" 2>> "$LOG") \
    || line="| $1 | $2 | $3 | - | - | - | $4 | no SPS: gpu_check_rows.py failed (gpu_check.log) |"
  echo "$line" >> "$MD"
  say "$line"
}
skip_row() { echo "| $1 | $2 | skipped | - | - | - | - | $3 |" >> "$MD"; say "skipped $1 ($2): $3"; }

: > "$LOG"
"$PYTHON" launch/gpu_check_rows.py --header > "$MD" || exit 1  # the table's first lines
say "gpu_check: budget $BUDGET_S s, rows: $ROWS; out: $OUT; $(nproc) CPU cores"
carry=()
[ -d .gpu-bundle/part1 ] && carry=(.gpu-bundle/part1)
timeout 60 "$PYTHON" launch/gpu_bundle.py --size "${carry[@]}" 2>&1 | tee -a "$LOG"
(( PIPESTATUS[0] == 0 )) || exit 1
if (( DRY )); then
  say "dry run: the carried wheels are not installed (this Python has its own packages)"
elif ls .gpu-bundle/part*/*.whl > /dev/null 2>&1; then
  run install "$(slot 120 5)" "$PYTHON" launch/gpu_bundle.py --install .gpu-bundle --target "$SITE"
  cat "$tmp/install.out" >> "$LOG"
  (( RC == 0 )) || { say "gpu_check: the carried wheels did not install (gpu_check.log)"; exit 1; }
fi
export PYTHONPATH="${SITE:+$SITE:}$PWD${PYTHONPATH:+:$PYTHONPATH}"
if (( DRY )); then
  say "dry run on CPU: rows c and d (CUDA only) skipped; $("$PYTHON" -c \
    'import torch; print("torch", torch.__version__)')"
else
  timeout 60 "$PYTHON" - <<'PY' 2>&1 | tee -a "$LOG"
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device; nothing to check")
p = torch.cuda.get_device_properties(0)
print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)")
PY
  (( PIPESTATUS[0] == 0 )) || exit 1
fi
say "setup took $(( SECONDS - START )) s"

copy_from() {  # SWEEP_DIR N: a trial has a complete run copy of iteration N on, not its last
  local f n
  for f in "$1"/runs/*/[0-9]*/trial.json; do
    [ -e "$f" ] || continue
    n=${f%/trial.json}
    n=$(( 10#${n##*/} ))
    (( n >= $2 && n < SWEEP_ITERS )) && return 0
  done
  return 1
}
row_a() {  # the main job end to end: a sweep through a checkpoint, a stop and a --resume
  local secs t0=$SECONDS dir=$tmp/sweeps/gpu rc1 stopped=0
  local what="2-trial sweep: SIGTERM past a checkpoint, then --resume (expect 130, 0)"
  secs=$(slot "$A_CAP" 40)
  (( secs > 0 )) || { skip_row a "$what" budget; return; }
  local until=$(( SECONDS + secs ))
  "$PYTHON" -m distppo sweep --games Breakout-v5 --seeds 1 2 --backend "$BACKEND" \
    --total-timesteps $(( SWEEP_ITERS * BATCH )) "${SIZE[@]}" "${SWEEP_FLAGS[@]}" \
    --checkpoint-every 2 --outputs-every-s 0 --storage "$tmp/sweeps" --name gpu \
    > "$tmp/sweep.out" 2>&1 &
  PIDS=("$!")
  # stopped once a trial has a checkpoint (a run copy) from iteration 2 on, or STOP_GRACE_S
  # before its time is out (then killed)
  while kill -0 "${PIDS[0]}" 2> /dev/null && (( SECONDS < until - STOP_GRACE_S )); do
    if copy_from "$dir" 2; then stopped=1; break; fi
    sleep 0.5
  done
  kill -TERM "${PIDS[0]}" 2> /dev/null
  while kill -0 "${PIDS[0]}" 2> /dev/null && (( SECONDS < until )); do sleep 0.5; done
  kill -KILL "${PIDS[0]}" 2> /dev/null
  wait "${PIDS[0]}"
  rc1=$?
  PIDS=()
  (( rc1 == 130 )) || keep sweep "$rc1"
  (( stopped )) || say "row a: no checkpoint to stop past in time (or the sweep ended first)"
  if (( until - SECONDS >= 15 )); then
    run sweep-resume $(( until - SECONDS )) "$PYTHON" -m distppo sweep --storage "$tmp/sweeps" \
      --name gpu --resume
  else
    RC=skipped
  fi
  add_row a "$what" "$rc1, $RC" $(( SECONDS - t0 )) "$dir"
}
train_row() {  # ROW CAP FLAGS...: `distppo train` with FLAGS
  local row=$1 cap=$2 secs; shift 2
  local what="${*:-(the defaults)}"
  secs=$(slot "$cap" 20)
  (( secs > 0 )) || { skip_row "$row" "$what" budget; return; }
  run "train-$row" "$secs" "$PYTHON" -m distppo train --env-id Breakout-v5 --backend "$BACKEND" \
    --total-timesteps "$STEPS" "${SIZE[@]}" --output-dir "$tmp/runs" --run-name "$row" \
    --log-every 10 "$@"
  add_row "$row" "$what" "$RC" "$WALL" "$tmp/runs/$row"
}
pack_row() {  # NAME: PACK --local trials at once, each on its share of the cores
  local name=$1 secs i t0=$SECONDS rc=0 what
  local -a cores
  read -r -a cores <<< "$("$PYTHON" -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
  local per=$(( ${#cores[@]} / PACK ))
  (( per >= 1 )) || per=1
  what="$PACK x --local on $per core(s) each"
  (( MPS_ON )) && what="$what, under MPS"
  secs=$(slot "$E_CAP" 30)
  (( secs > 0 )) || { skip_row e "$what" budget; return; }
  PIDS=()
  for (( i = 0; i < PACK; i++ )); do
    local mine="" j
    for (( j = i * per; j < i * per + per; j++ )); do
      mine+="${mine:+,}${cores[j % ${#cores[@]}]}"
    done
    local pin=(taskset -c "$mine")
    command -v taskset > /dev/null || pin=()  # unpinned where taskset is missing
    timeout -k 10 "$secs" "${pin[@]}" "$PYTHON" -m distppo train --local \
      --env-id Breakout-v5 --backend "$BACKEND" --total-timesteps "$STEPS" "${SIZE[@]}" \
      --num-threads "$per" --output-dir "$tmp/runs" --run-name "$name-$i" --log-every 1000 \
      > "$tmp/$name-$i.out" 2>&1 &
    PIDS+=("$!")
  done
  for (( i = 0; i < PACK; i++ )); do
    wait "${PIDS[i]}" || { rc=$?; keep "$name-$i" "$rc"; }
  done
  PIDS=()
  local runs=()
  for (( i = 0; i < PACK; i++ )); do runs+=("$tmp/runs/$name-$i"); done
  add_row e "$what" "$rc" $(( SECONDS - t0 )) "${runs[@]}"
}

if wanted a; then row_a; fi
if wanted b; then train_row b "$B_CAP"; fi
for row in c d; do
  wanted $row || continue
  flags=(--runner-device cuda --cuda-graphs)  # --act-in auto: the learner's process acts
  [ $row = d ] && flags+=(--overlap)
  if (( DRY )); then skip_row $row "${flags[*]}" "dry run: CUDA only"; continue; fi
  if [ $row = c ]; then train_row c "$C_CAP" "${flags[@]}"; else train_row d "$D_CAP" "${flags[@]}"; fi
done
if wanted e; then pack_row packed; fi
if wanted e-mps; then
  if start_mps; then
    pack_row packed-mps
    stop_mps
  else
    skip_row e "$PACK x --local, under MPS" "no MPS daemon here"
  fi
fi
if wanted tests; then
  secs=$(slot "$TESTS_CAP" 20)
  if (( secs > 0 )); then
    # --noconftest: the suite's conftest needs the test extra, which a bare GPU machine lacks
    # shellcheck disable=SC2086  # GPU_TESTS: several paths
    run gpu-tests "$secs" "$PYTHON" -m pytest -q -p no:cacheprovider --noconftest \
      -o addopts="" -m gpu $GPU_TESTS
    cat "$tmp/gpu-tests.out" >> "$LOG"
    echo "| tests | pytest -m gpu $GPU_TESTS | $RC | - | - | - | $WALL | $(grep -E \
      'passed|failed|skipped|error' "$tmp/gpu-tests.out" | tail -n 1) |" >> "$MD"
  else
    skip_row tests "pytest -m gpu $GPU_TESTS" budget
  fi
fi
if wanted rollout; then
  what="launch/rollout_bench.py --device cuda"
  if (( DRY )); then
    skip_row rollout "$what" "dry run: CUDA only"
  elif [ "$BACKEND" != envpool ]; then
    skip_row rollout "$what" "EnvPool only"
  elif (( $(slot 60 30) == 0 )); then
    skip_row rollout "$what" budget
  else
    run rollout "$(slot 60 30)" "$PYTHON" launch/rollout_bench.py --device cuda --iterations 20 \
      --repeats 1 --out "$OUT/gpu_check.rollout.md"
    echo "| rollout | $what | $RC | - | - | - | $WALL | its table: gpu_check.rollout.md |" >> "$MD"
  fi
fi
echo
cat "$MD"
