#!/usr/bin/env bash
# Every read-only check of this folder in one go, for a machine with a real GPU (see README.md).
#
#   e2e/real_gpu/run_checks.sh OUT_DIR [CTK_DIR]
#
# OUT_DIR receives real/<card>/ (read-only nvidia-smi captures to commit as tests/hardware/data/real/<card>/)
# and real-gpu-checks.tar.gz: nvidia-smi's view, `dra-gpu slices --hardware real` for each
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
# Read-only captures of the real card for the fidelity test (tests/hardware/test_compare_nvidia_smi.py), saved
# unpacked as OUT_DIR/real/<card>/ to be committed as tests/hardware/data/real/<card>/: the simulator's
# nvidia-smi is made from the same profile data as its NVML, so only a real card's output can show either wrong.
cap="$work/capture"
mkdir -p "$cap"
nvidia-smi -q -x >"$cap/nvidia-smi-q-x.xml" 2>"$cap/nvidia-smi-q-x.err"
nvidia-smi -q >"$cap/nvidia-smi-q.txt" 2>&1
nvidia-smi mig -lgip >"$cap/nvidia-smi-mig-lgip.txt" 2>&1
nvidia-smi mig -lgipp >"$cap/nvidia-smi-mig-lgipp.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv >"$cap/gpu.csv" 2>&1
date -u +%Y-%m-%dT%H:%M:%SZ >"$cap/taken-at.txt"
find "$cap" -name '*.err' -empty -delete
# <card>: the first GPU's product name as a folder name ("NVIDIA H100 80GB HBM3" -> nvidia-h100-80gb-hbm3)
card="$($py -c 'import sys, xml.etree.ElementTree as E; print(E.parse(sys.argv[1]).findtext("gpu/product_name", ""))' \
    "$cap/nvidia-smi-q-x.xml" 2>/dev/null | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' | sed 's/^-*//; s/-*$//')"
mkdir -p "$out/real/${card:-unknown-card}"
cp "$cap"/* "$out/real/${card:-unknown-card}/"
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
cat "$work/plugin-start.json" "$work/compare-nvidia-smi.txt" | sed -n 1,80p
