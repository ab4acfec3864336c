#!/usr/bin/env bash
# The GPU run of `make bench` (issue 15): vecmerge --device cuda at the Llama-3-70B shape, on a machine whose
# python3 already holds torch, safetensors, numpy, click, tabulate, scipy, pyyaml and tqdm (the tree is run
# from PYTHONPATH, nothing installed). A tiny smoke run first, so a broken CUDA path fails in seconds; each
# GPU output is also verified on the CPU (run.py does that for any --device other than cpu).
#   bash benchmarks/gpu.sh OUT_DIR [SHAPES]      (SHAPES default llama3-70b)
set -u
out=${1:?usage: gpu.sh OUT_DIR [SHAPES]}; shapes=${2:-llama3-70b}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
python3 benchmarks/run.py --tiny --device cuda --no-peft --no-dense --no-merges --keep --out /tmp/vm-bench-tiny \
  > "$out/tiny.md" 2> "$out/tiny.log"; echo "tiny smoke run: exit $?"; tail -5 "$out/tiny.log"
# the other commands on cuda, each output verified on the CPU (exit codes; errors in smoke.log)
vm() { python3 -c 'from vecmerge.cli import main; main()' "$@"; }
( cd /tmp/vm-bench-tiny/tiny/data && for c in \
    "audit --ref v54-v54e2 --dir v51-v28 --format json" \
    "merge --method ties v28 v51 v54 --density 0.5 --rank 8 --out /tmp/g-ties" \
    "merge --method ties v28 v51 v54 --density 0.5 --space core --out /tmp/g-ties-core" \
    "merge --method dare_ties v28 v51 --density 0.3 --seed 7 --rank 8 --out /tmp/g-dare" \
    "merge --method slerp v51 v54 --t 0.3 --out /tmp/g-slerp" \
    "project --base v54 --dir v51-v28 --trust 0.02 --mode orthogonal --rank 8 --out /tmp/g-orth"; do
    vm --quiet --device cuda $c > /dev/null 2>> "$out/smoke.log"; echo "cuda $c: exit $?"
  done
  for o in /tmp/g-*; do vm --quiet verify "$o" > /dev/null 2>> "$out/smoke.log"; echo "cpu verify $o: exit $?"; done )
python3 benchmarks/run.py --shapes "$shapes" --device cuda --no-peft --no-dense --no-merges --repeat 2 \
  --timeout 240 --keep --out /tmp/vm-bench > "$out/gpu.md" 2> "$out/gpu.log"; echo "GPU run: exit $?"
cat "$out/gpu.md"; tail -20 "$out/gpu.log"
# the same shapes on this machine's CPUs, for the side-by-side (skipped with CPU_TOO=0)
if [ "${CPU_TOO:-1}" = 1 ]; then
  python3 benchmarks/run.py --shapes "$shapes" --device cpu --no-peft --no-dense --no-merges --repeat 1 \
    --timeout 240 --keep --out /tmp/vm-bench > "$out/cpu.md" 2> "$out/cpu.log"; echo "CPU run: exit $?"
  cat "$out/cpu.md"
fi
