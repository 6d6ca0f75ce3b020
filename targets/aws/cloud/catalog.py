"""Static facts about EC2 that the preflight needs and AWS APIs do not answer directly.

Everything here is a fact we checked, with where it came from; anything AWS can tell us
live (offerings, EFA, vCPUs, GPUs, applied quotas, prices) is asked for, not stored.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

# EKS refuses control-plane subnets in these zones (DESIGN.md §3). Zone *names* are
# shuffled per account; zone IDs are not, so we match by ID.
EKS_REJECTED_ZONE_IDS = frozenset({"use1-az3", "usw1-az2", "cac1-az3"})

# Running On-Demand vCPU quotas (service code "ec2"), keyed by the instance-class
# letters of the family name (the "g" of g6, the "vt" of vt1). Source: Service Quotas
# console, "Running On-Demand ... instances".
QUOTA_SERVICE_CODE = "ec2"
QUOTA_G_VT = "L-DB2E81BA"
QUOTA_P = "L-417A185B"
QUOTA_STANDARD = "L-1216C47A"
QUOTA_NAMES = {
    QUOTA_G_VT: "Running On-Demand G and VT instances",
    QUOTA_P: "Running On-Demand P instances",
    QUOTA_STANDARD: "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
    "L-74FC7D96": "Running On-Demand F instances",
    "L-7295265B": "Running On-Demand X instances",
    "L-1945791B": "Running On-Demand Inf instances",
    "L-2C3B7624": "Running On-Demand Trn instances",
    "L-6E869C2A": "Running On-Demand DL instances",
}
_QUOTA_BY_CLASS = {
    "g": QUOTA_G_VT,
    "vt": QUOTA_G_VT,
    "p": QUOTA_P,
    "f": "L-74FC7D96",
    "x": "L-7295265B",
    "inf": "L-1945791B",
    "trn": "L-2C3B7624",
    "dl": "L-6E869C2A",
    **{letter: QUOTA_STANDARD for letter in ("a", "c", "d", "h", "i", "m", "r", "t", "z")},
}

# Spot capacity counts against quotas of its own, per class as above, of running Spot instances and open
# requests together (EC2 User Guide, "Spot Instance quotas"; the codes as the Service Quotas API names
# them). P is split now (P5 apart from P4, P3, P2) and Trn has one: neither code is mapped here.
SPOT_QUOTA_G_VT = "L-3819A6DF"
SPOT_QUOTA_STANDARD = "L-34B43A08"
_SPOT_QUOTA_BY_CLASS = {
    "g": SPOT_QUOTA_G_VT,
    "vt": SPOT_QUOTA_G_VT,
    "f": "L-88CF9481",
    "x": "L-E3A00192",
    "inf": "L-B5D1601B",
    "dl": "L-85EED4F7",
    **{letter: SPOT_QUOTA_STANDARD for letter in ("a", "c", "d", "h", "i", "m", "r", "t", "z")},
}
_SPOT_UNMAPPED_CLASSES = frozenset({"p", "trn"})
QUOTA_NAMES.update({
    SPOT_QUOTA_G_VT: "All G and VT Spot Instance Requests",
    SPOT_QUOTA_STANDARD: "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests",
    "L-88CF9481": "All F Spot Instance Requests",
    "L-E3A00192": "All X Spot Instance Requests",
    "L-B5D1601B": "All Inf Spot Instance Requests",
    "L-85EED4F7": "All DL Spot Instance Requests",
})

# Families with quotas of their own that we have not mapped: better "unknown" than wrong.
_UNMAPPED_CLASSES = frozenset({"hpc", "mac", "u"})
_FAMILY_RE = re.compile(r"^(?P<cls>[a-z]+?)(?P<gen>\d+)(?P<suffix>[a-z-]*)$")


def instance_family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def _class_and_generation(instance_type: str) -> tuple[str, int] | None:
    match = _FAMILY_RE.match(instance_family(instance_type))
    if match is None:
        return None
    return match["cls"], int(match["gen"])


def quota_code_for(instance_type: str, *, spot: bool = False) -> str | None:
    """The vCPU quota an instance type counts against, On-Demand or Spot, or None for families we do
    not map."""
    parsed = _class_and_generation(instance_type)
    if parsed is None:
        return None
    cls = parsed[0]
    if cls in _UNMAPPED_CLASSES:
        return None
    # Multi-letter classes not listed (gr6, im4gn, x2idn) count against their first letter's quota.
    if spot and cls in _SPOT_UNMAPPED_CLASSES:
        return None
    by_class = _SPOT_QUOTA_BY_CLASS if spot else _QUOTA_BY_CLASS
    return by_class.get(cls) or by_class.get(cls[0])


def gpudirect_rdma_possible(instance_type: str, efa_supported: bool) -> bool:
    """GPUDirect RDMA over EFA exists on P instances from p4d on; never on G (DESIGN.md §3)."""
    parsed = _class_and_generation(instance_type)
    return bool(efa_supported and parsed and parsed[0] == "p" and parsed[1] >= 4)


class InstanceFacts(BaseModel):
    """What one instance type offers, from ``describe_instance_types``."""

    instance_type: str
    vcpus: int
    memory_gib: float
    gpus: int = 0
    gpu_name: str | None = None
    gpu_memory_gib: float = 0.0
    efa_supported: bool = False
    efa_interfaces: int = 0
    network_cards: int = 1
    gdr: bool = False
    quota_code: str | None = None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> InstanceFacts:
        name = data["InstanceType"]
        gpu_info = data.get("GpuInfo") or {}
        gpus = gpu_info.get("Gpus") or []
        net = data.get("NetworkInfo") or {}
        efa = bool(net.get("EfaSupported"))
        return cls(
            instance_type=name,
            vcpus=int(data["VCpuInfo"]["DefaultVCpus"]),
            memory_gib=round(data.get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024, 1),
            gpus=sum(int(g.get("Count", 0)) for g in gpus),
            gpu_name=gpus[0].get("Name") if gpus else None,
            gpu_memory_gib=round(gpu_info.get("TotalGpuMemoryInMiB", 0) / 1024, 1),
            efa_supported=efa,
            efa_interfaces=int((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0)) if efa else 0,
            network_cards=int(net.get("MaximumNetworkCards") or 1),
            gdr=gpudirect_rdma_possible(name, efa),
            quota_code=quota_code_for(name),
        )

    @property
    def efa_per_node(self) -> int:
        """EFA interfaces a node gets: one per network card, as many as the type allows (eksctl's
        ``pkg/cfn/builder/network_interfaces.go`` and the EC2 User Guide, efa-acc-inst-types)."""
        return min(self.efa_interfaces, self.network_cards) if self.efa_supported else 0

    def describe(self) -> str:
        parts = [f"{self.vcpus} vCPU", f"{self.memory_gib:g} GiB"]
        if self.gpus:
            parts.insert(0, f"{self.gpus}× {self.gpu_name or 'GPU'} ({self.gpu_memory_gib:g} GiB GPU memory)")
        if self.efa_supported:
            rdma = "GPUDirect RDMA" if self.gdr else "no GPUDirect RDMA"
            parts.append(f"EFA ×{self.efa_interfaces}, {rdma}")
        else:
            parts.append("no EFA")
        return ", ".join(parts)


# --- Built-in price table --------------------------------------------------------------
# Used when the AWS Pricing API cannot be reached (no permission, other partition, offline)
# and always for the fixed parts of the plan. On-demand Linux, shared tenancy, USD per hour,
# us-east-1 list prices from the AWS EC2/EKS/VPC pricing pages as recorded in DESIGN.md §3
# (checked 2026-11). Other regions usually cost the same or more, so a region without its
# own entry gets the us-east-1 figure, labelled an estimate.
BUILTIN_PRICE_SOURCE = "built-in table: AWS us-east-1 on-demand list prices (DESIGN.md §3, checked 2026-11)"
BUILTIN_PRICE_REGION = "us-east-1"
BUILTIN_INSTANCE_PRICES: dict[str, float] = {
    "g6.xlarge": 0.8048,
    "g6.2xlarge": 0.9776,
    "g6.4xlarge": 1.3232,
    "g6.8xlarge": 2.0144,
    "g6.12xlarge": 4.6016,
    "g6.16xlarge": 3.3968,
    "g6.24xlarge": 6.6752,
    "g6.48xlarge": 13.3504,
    "m7i.large": 0.1008,
    "m7i.xlarge": 0.2016,
    "m7i.2xlarge": 0.4032,
}
# Regions whose on-demand prices for the types above equal us-east-1's.
BUILTIN_SAME_AS_US_EAST_1 = frozenset({"us-east-1", "us-east-2", "us-west-2"})
EKS_CONTROL_PLANE_PER_HOUR = 0.10
NAT_GATEWAY_PER_HOUR = 0.045
