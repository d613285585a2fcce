"""JSON Schemas of the opaque config kinds, generated from the pydantic models in `dra_gpu.config.api`.

    python -m dra_gpu.config.schemas --write api/schemas   # (re)generate the committed files
    python -m dra_gpu.config.schemas --check api/schemas   # exit 1 when they are out of date

The schemas are for editors and linters; the authority is `decode_opaque_config` (some checks, such as a limit
larger than the device, need the allocated devices and cannot be expressed in a schema).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from dra_gpu.config.api import GpuConfig, MigDeviceConfig
from dra_gpu.config.names import API_VERSION

_MODELS = (GpuConfig, MigDeviceConfig)


def schema_file_name(kind: str) -> str:
    group, version = API_VERSION.split("/")
    return f"{group}_{version}_{kind}.schema.json"


def build_schemas() -> dict[str, dict[str, Any]]:
    """File name -> JSON Schema (draft 2020-12) for each kind."""
    result: dict[str, dict[str, Any]] = {}
    for model in _MODELS:
        kind = model.model_fields["kind"].default
        schema = model.model_json_schema(mode="validation")
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://gpu.nvidia.com/schemas/{schema_file_name(kind)}",
            **schema,
            "title": f"{API_VERSION} {kind}",
            # Both fields are required on the wire even though the Python models default them.
            "required": sorted({*schema.get("required", ()), "apiVersion", "kind"}),
        }
        result[schema_file_name(kind)] = schema
    return result


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra_gpu.config.schemas", description="JSON Schemas")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="DIR", help="write <group>_<version>_<Kind>.schema.json files")
    mode.add_argument("--check", metavar="DIR", help="fail when the files in DIR differ from the models")
    args = parser.parse_args(argv)
    directory = (args.write or args.check).rstrip("/")
    stale: list[str] = []
    for name, schema in build_schemas().items():
        path = f"{directory}/{name}"
        text = render(schema)
        if args.write:
            try:
                with open(path, "w", encoding="utf-8") as out:
                    out.write(text)
            except FileNotFoundError:
                print(f"{directory}: directory does not exist; create it first", file=sys.stderr)
                return 1
            print(path)
            continue
        try:
            with open(path, encoding="utf-8") as current:
                if current.read() != text:
                    stale.append(path)
        except FileNotFoundError:
            stale.append(path)
    if stale:
        print("out of date (run `make schemas`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
