"""The `examples/<name>/expect.yaml` schema: what the end-to-end suite asserts for each example.

This module is the single source of truth; `examples/expect.schema.json` is generated from it
(`python tests/deploy/expect_model.py --write`) for consumers that are not Python. The meaning of each field
is documented in `examples/README.md`. Field names are camelCase because they are written in YAML next to
Kubernetes manifests.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SCHEMA_VERSION = 1
DeviceType = Literal["gpu", "mig", "gpu-share"]
PodPhase = Literal["Running", "Succeeded", "Pending"]
ComputeMode = Literal["DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED"]
# Cluster features an example needs beyond scheduling + the kubelet plugin; the suite skips an example
# whose requirement the cluster lacks, and says so.
# "consumable-shares": the driver runs with --consumable-shares (whole GPUs allow multiple allocations)
Requirement = Literal[
    "webhook", "extended-resource", "resource-quota", "kubernetes>=1.35", "consumable-shares"
]

# A Kubernetes quantity as users write it ("10Gi", "25", "1.5").
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i?|[munk])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_CONTAINER_REF = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Quantity = Annotated[str, Field(pattern=_QUANTITY.pattern)]
DnsLabel = Annotated[str, Field(pattern=_DNS_LABEL.pattern, max_length=63)]
ContainerRef = Annotated[str, Field(pattern=_CONTAINER_REF.pattern, description="<pod>/<container>")]


def _check_regex(value: str, field: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{field}: {value!r} is not a valid regular expression: {exc}") from exc
    return value


class _Strict(BaseModel):
    # Unknown keys are typos: a misspelt assertion would otherwise be silently skipped.
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeviceExpectation(_Strict):
    """The devices allocated for a container or a claim (allocation results of driver gpu.nvidia.com)."""

    count: int = Field(ge=0, description="number of allocation results")
    type: DeviceType = Field(description="value of the device attribute gpu.nvidia.com/type for every device")
    request: str | None = Field(
        default=None,
        description="every result's request must equal this, e.g. 'gpu/h100' for a firstAvailable subrequest",
    )
    profiles: list[str] | None = Field(
        default=None, description="MIG profiles of the devices, as a multiset (order does not matter)"
    )
    sameAttribute: list[str] = Field(
        default_factory=list, description="attributes whose value is the same on every device"
    )
    attributes: dict[str, str] = Field(
        default_factory=dict, description="attribute -> regex that must match (re.search) the value as text"
    )
    minCapacity: dict[str, Quantity] = Field(
        default_factory=dict, description="capacity name -> lower bound every device must meet"
    )

    @field_validator("attributes")
    @classmethod
    def _regexes(cls, value: dict[str, str]) -> dict[str, str]:
        for name, pattern in value.items():
            _check_regex(pattern, f"attributes.{name}")
        return value

    @model_validator(mode="after")
    def _profiles_fit(self) -> DeviceExpectation:
        if self.profiles is not None:
            if self.type != "mig":
                raise ValueError(f"profiles is only meaningful for type 'mig', not {self.type!r}")
            if len(self.profiles) != self.count:
                raise ValueError(f"profiles lists {len(self.profiles)} entries but count is {self.count}")
        return self


class ContainerExpectation(_Strict):
    name: DnsLabel
    devices: DeviceExpectation | None = None
    env: dict[str, str] = Field(
        default_factory=dict, description="variable -> regex that must fully match its value ('.+': set)"
    )
    envAbsent: list[str] = Field(default_factory=list)
    deviceNodes: dict[str, int] = Field(
        default_factory=dict, description="glob (fnmatch) -> exact number of listed paths that match it"
    )

    @field_validator("env")
    @classmethod
    def _regexes(cls, value: dict[str, str]) -> dict[str, str]:
        for name, pattern in value.items():
            _check_regex(pattern, f"env.{name}")
        return value

    @field_validator("deviceNodes")
    @classmethod
    def _globs(cls, value: dict[str, int]) -> dict[str, int]:
        for glob, count in value.items():
            if not glob.startswith("/dev/"):
                raise ValueError(f"deviceNodes: {glob!r} must be an absolute glob under /dev/")
            if count < 0:
                raise ValueError(f"deviceNodes.{glob}: count must be >= 0, got {count}")
        return value


class EventExpectation(_Strict):
    reason: str
    messageRegex: str
    type: Literal["Normal", "Warning"] = "Warning"

    @field_validator("messageRegex")
    @classmethod
    def _regex(cls, value: str) -> str:
        return _check_regex(value, "messageRegex")


class PodExpectation(_Strict):
    name: DnsLabel | None = None
    selector: dict[str, str] | None = Field(default=None, description="matchLabels of a workload's pods")
    count: int = Field(default=1, ge=1)
    phase: PodPhase | None = None
    phases: dict[PodPhase, int] | None = Field(
        default=None, description="how many of the matched pods end in each phase"
    )
    events: list[EventExpectation] = Field(
        default_factory=list, description="events every matched pod that ends Pending must have"
    )
    containers: list[ContainerExpectation] = Field(
        default_factory=list, description="checked on every matched pod that ends Running or Succeeded"
    )

    @model_validator(mode="after")
    def _one_way(self) -> PodExpectation:
        if (self.name is None) == (self.selector is None):
            raise ValueError("give exactly one of name (a single pod) or selector (pods of a Job/Deployment)")
        if self.name is not None and self.count != 1:
            raise ValueError("count must be 1 (or omitted) when the pod is named")
        if (self.phase is None) == (self.phases is None):
            raise ValueError("give exactly one of phase (all pods) or phases (counts per phase)")
        if self.phases is not None and sum(self.phases.values()) != self.count:
            raise ValueError(f"phases add up to {sum(self.phases.values())} pods but count is {self.count}")
        ends_pending = self.phase == "Pending" or bool(self.phases and self.phases.get("Pending"))
        if self.events and not ends_pending:
            raise ValueError("events are checked on pods that end Pending, but no pod is expected Pending")
        if self.phase == "Pending" and self.containers:
            raise ValueError("containers are checked on Running/Succeeded pods only; drop them for Pending")
        names = [c.name for c in self.containers]
        if len(set(names)) != len(names):
            raise ValueError(f"container names repeat: {names}")
        return self


class ClaimRef(_Strict):
    """A ResourceClaim: by name, or the claim a pod got for one of its pod claims (from a template)."""

    name: DnsLabel | None = None
    pod: DnsLabel | None = None
    podSelector: dict[str, str] | None = None
    podClaim: DnsLabel | None = None

    @model_validator(mode="after")
    def _one_way(self) -> ClaimRef:
        by_pod = self.pod is not None or self.podSelector is not None
        if self.name is not None and (by_pod or self.podClaim is not None):
            raise ValueError("give either name, or pod/podSelector with podClaim, not both")
        if self.name is None:
            if self.pod is not None and self.podSelector is not None:
                raise ValueError("give pod or podSelector, not both")
            if not by_pod or self.podClaim is None:
                raise ValueError("give name, or pod (or podSelector) together with podClaim")
        return self


class MpsExpectation(_Strict):
    activeThreadPercentage: int | None = Field(default=None, ge=0, le=100)
    pinnedMemoryLimit: Quantity | None = None


class HardwareExpectation(_Strict):
    """State of the simulated hardware (`dra-gpu hardware state -o json`) for each device of the claim."""

    computeMode: ComputeMode | None = None
    timeSlice: int | None = Field(default=None, ge=0, le=3, description="0 Default 1 Short 2 Medium 3 Long")
    mpsDaemon: bool | None = Field(default=None, description="whether an MPS control daemon serves it")
    mps: MpsExpectation | None = None
    migInstances: list[str] | None = Field(
        default=None, description="profiles of the MIG instances created for the claim (multiset)"
    )

    @model_validator(mode="after")
    def _mps_needs_daemon(self) -> HardwareExpectation:
        if self.mps is not None and self.mpsDaemon is False:
            raise ValueError("mps limits need an MPS daemon; mpsDaemon must not be false")
        return self


class ClaimExpectation(_Strict):
    ref: ClaimRef
    allocated: bool = True
    reservedFor: int | None = Field(default=None, ge=0, description="number of entries in status.reservedFor")
    devices: DeviceExpectation | None = None
    consumedCapacity: dict[str, Quantity] | None = Field(
        default=None, description="consumedCapacity of every allocation result (consumable capacity)"
    )
    hardware: HardwareExpectation | None = None

    @model_validator(mode="after")
    def _unallocated_has_nothing(self) -> ClaimExpectation:
        others = (self.devices, self.consumedCapacity, self.hardware, self.reservedFor)
        if not self.allocated and any(x is not None for x in others):
            raise ValueError(
                "a claim expected to stay unallocated cannot have devices, consumedCapacity, "
                "hardware or reservedFor expectations"
            )
        return self


class RejectedObject(_Strict):
    kind: str
    name: DnsLabel
    messageRegex: str

    @field_validator("messageRegex")
    @classmethod
    def _regex(cls, value: str) -> str:
        return _check_regex(value, "messageRegex")


class Footprint(_Strict):
    gpus: int = Field(
        ge=0,
        le=8,
        description="distinct physical GPUs the example's claims are on, exactly (a MIG device or a share "
        "counts its GPU): checked offline (tests/deploy/test_examples_allocate.py) and on the cluster",
    )


class Cleanup(_Strict):
    hardwareReset: bool = Field(
        default=True,
        description="after deletion every GPU is back to baseline: compute mode DEFAULT, time "
        "slice 0, no MPS daemon, no MIG instance made for a claim",
    )


class Expectation(_Strict):
    schemaVersion: Literal[1]
    name: DnsLabel
    summary: str = Field(min_length=1)
    hardware: str = Field(default="dgx-h100", description="simulated node layout the expectations hold for")
    nvidiaSmi: list[str] = Field(
        default_factory=list,
        description="what an admin does on the node out of band before the example (NVIDIA's READMEs: MIG "
        "mode, a mig-parted layout), as nvidia-smi argument lists run in this order on a fresh simulated "
        "node of `hardware`",
    )
    namespace: DnsLabel
    manifests: list[str] = Field(min_length=1, description="files applied in this order")
    footprint: Footprint
    requires: list[Requirement] = Field(default_factory=list)
    timeoutSeconds: int = Field(default=180, ge=10, le=900)
    rejected: list[RejectedObject] = Field(default_factory=list)
    pods: list[PodExpectation] = Field(default_factory=list)
    claims: list[ClaimExpectation] = Field(default_factory=list)
    sameDevices: list[list[ContainerRef]] = Field(
        default_factory=list, description="groups of containers that see exactly the same devices"
    )
    distinctDevices: list[list[ContainerRef]] = Field(
        default_factory=list, description="groups of containers whose devices do not overlap"
    )
    cleanup: Cleanup = Field(default_factory=Cleanup)

    @model_validator(mode="after")
    def _something_to_check(self) -> Expectation:
        if not (self.pods or self.rejected or self.claims):
            raise ValueError("nothing to check: give pods, claims or rejected")
        for group in (*self.sameDevices, *self.distinctDevices):
            if len(group) < 2:
                raise ValueError(f"a sameDevices/distinctDevices group needs two or more containers: {group}")
        return self


class ExpectationError(ValueError):
    """An expect.yaml that does not fit the schema; the message names the file and each bad field."""


def load_expectation(path: Path) -> Expectation:
    try:
        data: Any = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ExpectationError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ExpectationError(f"{path}: must be a mapping, got {type(data).__name__}")
    try:
        return Expectation.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {where}: {err['msg']}")
        raise ExpectationError(
            f"{path}: does not fit the expect.yaml schema (examples/README.md):\n" + "\n".join(lines)
        ) from exc


def json_schema() -> dict[str, Any]:
    schema = Expectation.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "dra-gpu example expectations (examples/<name>/expect.yaml)"
    return schema


def render_json_schema() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


SCHEMA_FILE = Path(__file__).resolve().parents[2] / "examples" / "expect.schema.json"

if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        SCHEMA_FILE.write_text(render_json_schema())
        print(f"wrote {SCHEMA_FILE}")
    else:
        sys.stdout.write(render_json_schema())
