#!/usr/bin/env bash
# GPU check (issue 10, item 7): `distppo bench` on a CUDA machine, the learner on the GPU
# (--learner-gpus auto gives it one), several env runners; prints SPS and per-phase seconds
# per variant and the minutes 10M Breakout steps would take at that SPS.
#
#   bash launch/gpu_check.sh                  # defaults below; about 10 minutes on one GPU
#   STEPS=204800 REPEATS=3 RUNNERS=8 bash launch/gpu_check.sh
#
# Paste the table, the GPU line and the command into docs/benchmarks.md ("GPU").
set -euo pipefail
PYTHON=${PYTHON:-python}
STEPS=${STEPS:-102400}     # 100 iterations of CleanRL's 8 x 128
REPEATS=${REPEATS:-1}
RUNNERS=${RUNNERS:-4}
OUT=${OUT:-gpu_check.md}

"$PYTHON" - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device; nothing to check")
p = torch.cuda.get_device_properties(0)
print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)")
PY
nproc | sed 's/^/CPU cores: /'

# The learner on CUDA in every variant; runners on CPU (Atari inference is tiny) except the
# last, which also acts on the GPU (4 runners share it in quarters).
"$PYTHON" -m distppo bench --env-id Breakout-v5 --backend envpool --algo ppo \
  --total-timesteps "$STEPS" --repeats "$REPEATS" --extra "--device cuda" \
  --variant "local=--local" \
  --variant "ray-1runner=" \
  --variant "ray-${RUNNERS}runners=--num-env-runners $RUNNERS" \
  --variant "ray-${RUNNERS}runners-overlap=--num-env-runners $RUNNERS --overlap" \
  --variant "overlap-compile-bf16=--num-env-runners $RUNNERS --overlap --compile --amp bf16" \
  --variant "overlap-runners-cuda=--num-env-runners $RUNNERS --overlap --runner-device cuda" \
  --out "$OUT"

"$PYTHON" - "$OUT" <<'PY'
import sys
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.split("|")[1:-1]]
    if len(cells) > 3 and cells[0] == "ppo":
        sps = float(cells[2].replace(",", ""))
        print(f"{cells[1]:28s} {sps:8,.0f} SPS -> 10M steps in {1e7 / sps / 60:6.1f} min")
PY
