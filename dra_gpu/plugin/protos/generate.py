"""Regenerate the committed gRPC stubs from `api/proto/` (`python -m dra_gpu.plugin.protos.generate [--check]`).

`grpc_tools.protoc` writes `import <path under -I> ...` into `_pb2_grpc.py`. To get imports that work inside
this package, each `.proto` is copied to a staging tree at `dra_gpu/plugin/protos/<module>.proto` and compiled
with `-I <staging>`; the generated modules then import each other as `dra_gpu.plugin.protos.<module>_pb2`.
The wire names (`/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/...`) come from the `package` statements and are
unaffected by the file location.

`--check` regenerates into a temporary directory and fails when any committed file would change (CI).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parents[2]
PROTO_ROOT = REPO_ROOT / "api" / "proto"
PACKAGE_PATH = Path("dra_gpu", "plugin", "protos")

# source under api/proto -> module name in dra_gpu.plugin.protos (descriptor file names must be unique)
PROTO_MODULES: dict[str, str] = {
    "pluginregistration/v1/api.proto": "pluginregistration_v1",
    "dra/v1/api.proto": "dra_v1",
    "dra/v1beta1/api.proto": "dra_v1beta1",
    "dra-health/v1alpha1/api.proto": "dra_health_v1alpha1",
}
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generated_names() -> list[str]:
    return sorted(module + suffix for module in PROTO_MODULES.values() for suffix in GENERATED_SUFFIXES)


def _tool(name: str) -> str:
    """mypy-protobuf's protoc plugins live next to the interpreter; the venv need not be on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install the dev extras (`pip install -e '.[dev]'`, mypy-protobuf)")
    return found


def generate_into(out_dir: Path) -> None:
    """Compile every proto; the generated files land flat in `out_dir`."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    with tempfile.TemporaryDirectory(prefix="protos-") as tmp:
        staging = Path(tmp) / "in"
        target = Path(tmp) / "out"
        (staging / PACKAGE_PATH).mkdir(parents=True)
        target.mkdir()
        staged: list[str] = []
        for source, module in PROTO_MODULES.items():
            shutil.copyfile(PROTO_ROOT / source, staging / PACKAGE_PATH / f"{module}.proto")
            staged.append(str(PACKAGE_PATH / f"{module}.proto"))
        grpc_include = Path(protoc.__file__).parent / "_proto"
        args = [
            "grpc_tools.protoc",
            f"--plugin=protoc-gen-mypy={_tool('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={_tool('protoc-gen-mypy_grpc')}",
            f"-I{staging}",
            f"-I{grpc_include}",
            f"--python_out={target}",
            f"--grpc_python_out={target}",
            f"--mypy_out={target}",
            f"--mypy_grpc_out={target}",
            *staged,
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed for {', '.join(PROTO_MODULES)}")
        for name in generated_names():
            shutil.copyfile(target / PACKAGE_PATH / name, out_dir / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if regenerating would change a file")
    args = parser.parse_args(argv)
    if not args.check:
        generate_into(PACKAGE_DIR)
        print(f"generated {len(generated_names())} files in {PACKAGE_DIR}")
        return 0
    with tempfile.TemporaryDirectory(prefix="protos-check-") as tmp:
        fresh = Path(tmp)
        generate_into(fresh)
        stale = [
            name
            for name in generated_names()
            if not (PACKAGE_DIR / name).exists() or not filecmp.cmp(fresh / name, PACKAGE_DIR / name, False)
        ]
    if stale:
        print(
            "generated stubs are out of date: " + ", ".join(stale) + "; run `make protos` and commit the result",
            file=sys.stderr,
        )
        return 1
    print("generated stubs are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
