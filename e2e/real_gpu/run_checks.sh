#!/usr/bin/env bash
# Every read-only check of this folder in one go, for a machine with a real GPU (see README.md).
#
#   e2e/real_gpu/run_checks.sh OUT_DIR [CTK_DIR]
#
# OUT_DIR receives real-gpu-checks.tar.gz: nvidia-smi's view, `dra-gpu slices --hardware real` for each
# consumable-shares mode and each Kubernetes layout (1.34, 1.37, 1.37 with DRAListTypeAttributes), the
# discovery-vs-nvidia-smi comparison, the CDI comparison with `nvidia-ctk cdi generate` (when CTK_DIR holds
# nvidia-ctk and nvidia-cdi-hook), and the plugin's start-up time and memory. Changes no GPU setting.
set -uo pipefail
out="$1"; ctk="${2:+$(realpath "$2")}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$(dirname "$0")/../.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
py="${PYTHON:-python3}"

{ nvidia-smi -q; nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode --format=csv; } \
    >"$work/nvidia-smi.txt" 2>&1
$py -c 'import sys; print(sys.version); import rich' >"$work/python.txt" 2>&1
$py -m dra_gpu.hardware.compare_nvidia_smi --hardware real --nvidia-driver-root / >"$work/compare-nvidia-smi.txt" 2>&1
for shares in disabled memory unlimited 4; do
    for kv in 1.34 1.37; do
        $py -m dra_gpu.cli.main slices --hardware real --node real-h100 --consumable-shares "$shares" \
            --kubernetes-version "$kv" -o json >"$work/slices-$shares-$kv.json" 2>"$work/slices-$shares-$kv.err"
    done
done
$py -m dra_gpu.cli.main slices --hardware real --node real-h100 --feature-gates DRAListTypeAttributes=true \
    -o json >"$work/slices-list-attributes-1.37.json" 2>"$work/slices-list-attributes-1.37.err"
if [ -n "$ctk" ]; then
    $py e2e/real_gpu/cdi_compare.py --nvidia-ctk "$ctk/nvidia-ctk" --hook "$ctk/nvidia-cdi-hook" \
        >"$work/cdi-compare.json" 2>"$work/cdi-compare.err"
fi
$py -X importtime -c 'import dra_gpu.cli.kubelet_plugin' 2>"$work/importtime.txt"
$py e2e/real_gpu/plugin_start.py --runs 5 >"$work/plugin-start.json" 2>"$work/plugin-start.err"
mkdir -p "$out"
tar -C "$work" -czf "$out/real-gpu-checks.tar.gz" .
ls -la "$work"
cat "$work/plugin-start.json" "$work/compare-nvidia-smi.txt" | head -80
