"""The kind cluster's config for one Kubernetes version, and each simulated node's driver root (run.sh).

    cluster_config.py config --apiserver BIN --cluster NAME --sim-roots DIR --etcd-tag T --coredns-tag T
    cluster_config.py prepare-root --hardware LAYOUT --seed NODE --root DIR [--setup-from EXPECT_YAML]

`config` prints e2e/kind/cluster.yaml made right for the version under test: kind cannot filter feature gates
and a component given a gate it does not know refuses to start, so the gates are the local cluster's
(e2e/cluster/cluster.py NODE_FEATURE_GATES plus DynamicResourceAllocation) that this version's kube-apiserver
lists in its --help (GA gates are removed upstream; 1.34 still has DRAAdminAccess, DRAPrioritizedList, ...).
cluster.yaml itself holds the result for the pinned version (tests/e2e_kind/test_kind_config.py checks it).
It also names the cluster, points each worker's driver-root mount at its own root and fills in the etcd and
CoreDNS tags the node image carries.

`prepare-root` makes a node's simulated driver root (`dra-gpu hardware init-sim`) and, with --setup-from, runs
the `nvidiaSmi` steps of one of NVIDIA's examples (its expect.yaml) on it: the out-of-band setup an admin does
before the example (MIG mode, a mig-parted layout), so the node is the hardware the example was written for.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = Path(__file__).resolve().parent / "cluster.yaml"
DRIVER_ROOT_IN_NODE = "/opt/dra-gpu/driver-root"


def wanted_gates() -> list[str]:
    sys.path.insert(0, str(REPO / "e2e" / "cluster"))
    try:
        import cluster

        return [*cluster.NODE_FEATURE_GATES, "DynamicResourceAllocation"]
    finally:
        sys.path.pop(0)


def worker_name(cluster: str, index: int) -> str:
    """kind's names for workers: <cluster>-worker, <cluster>-worker2, ..."""
    return f"{cluster}-worker{index + 1 if index else ''}"


def render(
    template: dict[str, Any], known: set[str], cluster: str, sim_roots: str, etcd_tag: str, coredns_tag: str
) -> dict[str, Any]:
    config = dict(template, name=cluster)
    config["featureGates"] = {gate: True for gate in wanted_gates() if gate in known}
    if "DRADeviceTaints" in known:
        # Device taints still behind their gate (1.34, 1.35): the scheduler watches DeviceTaintRules in
        # resource.k8s.io/v1alpha3 and schedules nothing until that version is served (as the local cluster's
        # --runtime-config does). Once the gate is gone (GA) v1 serves them.
        config["runtimeConfig"] = {**template["runtimeConfig"], "resource.k8s.io/v1alpha3": "true"}
    config["kubeadmConfigPatches"] = [
        p.replace("ETCD_IMAGE_TAG", etcd_tag).replace("COREDNS_IMAGE_TAG", coredns_tag)
        for p in template["kubeadmConfigPatches"]
    ]
    nodes = []
    workers = 0
    for node in template["nodes"]:
        node = dict(node)
        if node["role"] == "worker":
            root = f"{sim_roots}/{worker_name(cluster, workers)}/driver-root"
            node["extraMounts"] = [
                dict(m, hostPath=root) if m["containerPath"] == DRIVER_ROOT_IN_NODE else m
                for m in node.get("extraMounts", [])
            ]
            workers += 1
        nodes.append(node)
    config["nodes"] = nodes
    return config


def nvidia_smi_steps(expect_yaml: Path) -> list[str]:
    steps = (yaml.safe_load(expect_yaml.read_text()) or {}).get("nvidiaSmi") or []
    if not steps:
        raise SystemExit(f"{expect_yaml} has no nvidiaSmi steps: nothing to set up")
    return [str(s) for s in steps]


def prepare_root(hardware: str, seed: str, root: Path, setup_from: Path | None) -> None:
    cli = [sys.executable, "-m", "dra_gpu.cli.main", "hardware"]
    subprocess.run(
        [*cli, "init-sim", "--hardware", hardware, "--seed", seed, "--driver-root", str(root)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    for step in nvidia_smi_steps(setup_from) if setup_from else []:
        done = subprocess.run(
            [str(root / "usr" / "bin" / "nvidia-smi"), *shlex.split(step)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"`nvidia-smi {step}` on {root} ({hardware}) failed: {done.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cfg = sub.add_parser("config", help="print the cluster config for the version of --apiserver")
    cfg.add_argument("--apiserver", type=Path, required=True, help="kube-apiserver of the version under test")
    cfg.add_argument("--cluster", required=True)
    cfg.add_argument("--sim-roots", required=True)
    cfg.add_argument("--etcd-tag", required=True)
    cfg.add_argument("--coredns-tag", required=True)
    prep = sub.add_parser("prepare-root", help="a node's simulated driver root, set up as an example needs")
    prep.add_argument("--hardware", required=True)
    prep.add_argument("--seed", required=True)
    prep.add_argument("--root", type=Path, required=True)
    prep.add_argument("--setup-from", type=Path, help="an example's expect.yaml whose nvidiaSmi steps to run")
    args = parser.parse_args(argv)
    if args.command == "config":
        sys.path.insert(0, str(REPO))
        from tests.support.control_plane import usable_feature_gates

        if not args.apiserver.exists():
            raise SystemExit(f"{args.apiserver} is missing: e2e/cluster/build.sh control-plane builds it")
        known = usable_feature_gates(args.apiserver)
        template = yaml.safe_load(TEMPLATE.read_text())
        config = render(template, known, args.cluster, args.sim_roots, args.etcd_tag, args.coredns_tag)
        print("# generated by e2e/kind/cluster_config.py from e2e/kind/cluster.yaml")
        print(yaml.safe_dump(config, sort_keys=False), end="")
    else:
        prepare_root(args.hardware, args.seed, args.root, args.setup_from)
    return 0


if __name__ == "__main__":
    sys.exit(main())
