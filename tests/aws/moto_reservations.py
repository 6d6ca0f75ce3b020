"""Which capacity a managed nodegroup's instances land in, as EC2 decides it (issue 20 item 8).

moto launches a nodegroup's instances whatever its launch template says about reservations, and
``SCRIPT.reservations`` (served by ``DescribeCapacityReservations``, moto_ext) were seen only by the
preflight. Here the launch draws from them the way EC2 does, so what the preflight counts is tested
against what the launch really uses:

- **Open ODCRs** (``InstanceMatchCriteria: open``) take, without being named, any instance whose
  attributes match: instance type, platform, AZ, tenancy; only while ``active``. Launch template
  ``CapacityReservationSpecification.CapacityReservationPreference`` ``open`` (the default) lets an
  instance run in one; ``none`` keeps it out. What they cannot hold runs as On-Demand (and meets
  ``InsufficientInstanceCapacity`` where the AZ has none).
  References: EC2 API reference, ``CapacityReservationSpecification`` and
  ``LaunchTemplateCapacityReservationSpecificationRequest`` (preferences open / none /
  capacity-reservations-only); EC2 User Guide, "On-Demand Capacity Reservations", instance
  eligibility (open vs targeted match criteria).
- **Targeted ODCRs** (``InstanceMatchCriteria: targeted``) take only instances that name them in
  ``CapacityReservationTarget.CapacityReservationId``. A named reservation must match the launch
  (type, AZ, platform, tenancy) and be ``active``, else the launch fails; a launch asking for more
  instances than it has free fails with ``ReservationCapacityExceeded`` for the rest (EC2 API
  reference, "Error codes": ReservationCapacityExceeded, InvalidCapacityReservationId.NotFound).
- **Capacity Blocks for ML** (``ReservationType: capacity-block``, always targeted): a managed
  nodegroup uses one only with ``capacityType: CAPACITY_BLOCK`` and a launch template whose
  ``InstanceMarketOptions.MarketType`` is ``capacity-block`` and whose
  ``CapacityReservationSpecification.CapacityReservationTarget`` names the block; such a nodegroup
  needs a launch template (EKS User Guide, "Create a managed node group with Capacity Blocks for
  ML", capacity-blocks-mng; EC2 User Guide, "Launch instances using Capacity Blocks": the block's
  AZ and platform, the reservation ID is required). ``CAPACITY_BLOCK`` without a block target
  launches nothing.

- **Placement groups** (the launch template's ``Placement.GroupName``; a reservation's
  ``PlacementGroupArn``). A reservation made in a cluster placement group holds its capacity inside
  that group: only instances launched into that group draw on it, and a launch that names no group
  is placed in the reservation's group (EC2 User Guide, "Use Capacity Reservations with cluster
  placement groups", cr-cpg; aws-parallelcluster PR #7252, "the ODCR decides the placement using its
  own PG"). A targeted launch into *another* group than its reservation's finds no capacity it may
  use and fails (aws-parallelcluster ``PlacementGroupCapacityReservationValidator``: an error). A
  reservation made outside any group holds capacity somewhere in the AZ, not in the fresh cluster
  group the launch names: EC2 must still place every instance together in that group, and that is
  where insufficient-capacity errors come from "even if the capacity reservation has remaining
  capacity" (the same validator's warning; eksctl PR #8220 stopped adding a placement group to a
  nodegroup that uses a reservation for this reason). The double answers that worst case:
  ``InsufficientInstanceCapacity``. Open ODCRs outside any group still take matching instances
  launched into a group (EC2 User Guide, "Placement group rules and limitations"). Capacity Blocks
  are already co-located in an UltraCluster and take no placement group: a launch that names one is
  refused (EC2 User Guide, "Capacity Blocks for ML"; aws-parallelcluster PR #6311 makes it an error).

Instances drawn from a reservation lower its ``AvailableInstanceCount`` until their nodegroup is
gone; reserved capacity is held, so those instances never meet ``InsufficientInstanceCapacity``.
"""

from __future__ import annotations

from typing import Any

from moto.eks.models import Nodegroup

LINUX = "Linux/UNIX"


def _reservations(region: str) -> list[dict[str, Any]]:
    from tests.aws.moto_ext import SCRIPT

    return SCRIPT.reservations.get(region, [])


def _mismatch(cr: dict[str, Any], itype: str, zone: str | None) -> str | None:
    if cr.get("State") != "active":
        return f"Capacity Reservation {cr['CapacityReservationId']} is {cr.get('State')}, not active"
    if cr.get("InstanceType") != itype:
        return f"Capacity Reservation {cr['CapacityReservationId']} is for {cr.get('InstanceType')}, not {itype}"
    if cr.get("AvailabilityZone") != zone:
        return f"Capacity Reservation {cr['CapacityReservationId']} is in {cr.get('AvailabilityZone')}, not {zone}"
    if cr.get("InstancePlatform") != LINUX or cr.get("Tenancy", "default") != "default":
        return (f"Capacity Reservation {cr['CapacityReservationId']} is for {cr.get('InstancePlatform')} "
                f"({cr.get('Tenancy')} tenancy), not Linux/UNIX (default tenancy)")
    return None


def placement_group_of(cr: dict[str, Any]) -> str | None:
    """The name of the cluster placement group a reservation was made in (None: none)."""
    arn = cr.get("PlacementGroupArn")
    return str(arn).rsplit("/", 1)[-1] if arn else None


def draw(region: str, ng: Nodegroup, info: dict[str, Any]) -> tuple[int, str | None]:
    """How many of the nodegroup's instances land in reservations (taken from them), and why the launch
    fails (None: it does not; the rest runs On-Demand)."""
    lt = info.get("launch_template") or {}
    spec = lt.get("CapacityReservationSpecification") or {}
    target = (spec.get("CapacityReservationTarget") or {}).get("CapacityReservationId")
    market = (lt.get("InstanceMarketOptions") or {}).get("MarketType")
    block_type = (getattr(ng, "capacity_type", None) or "ON_DEMAND") == "CAPACITY_BLOCK"
    want, itype, zone = info["desired_size"], info["instance_type"], info.get("zone")
    group = (lt.get("Placement") or {}).get("GroupName") or None
    taken: list[tuple[dict[str, Any], int]] = []
    if target:
        cr = next((c for c in _reservations(region) if c["CapacityReservationId"] == target), None)
        if cr is None:
            return 0, f"InvalidCapacityReservationId.NotFound: The Capacity Reservation ID '{target}' does not exist"
        block = cr.get("ReservationType") == "capacity-block"
        if block and (market != "capacity-block" or not block_type):
            return 0, (f"InvalidParameterCombination: {target} is a Capacity Block: the launch template needs "
                       "InstanceMarketOptions MarketType capacity-block and the nodegroup capacityType CAPACITY_BLOCK")
        if not block and (market == "capacity-block" or block_type):
            return 0, f"InvalidParameterCombination: {target} is not a Capacity Block"
        why = _mismatch(cr, itype, zone)
        if why:
            return 0, f"InvalidParameterValue: {why}"
        held_in = placement_group_of(cr)
        if block and group:
            return 0, (f"InvalidParameterCombination: Capacity Block {target} cannot be launched into placement "
                       f"group {group}")
        if held_in and group and group != held_in:
            return 0, (f"InvalidParameterCombination: Capacity Reservation {target} is in placement group "
                       f"{held_in}, not {group}")
        if not block and not held_in and group:
            return 0, (f"InsufficientInstanceCapacity: We currently do not have sufficient {itype} capacity in "
                       f"placement group {group} ({zone}); Capacity Reservation {target} holds its capacity "
                       "outside it")
        fits = min(want, int(cr["AvailableInstanceCount"]))
        taken.append((cr, fits))
        failure = None if fits == want else (
            f"ReservationCapacityExceeded: The requested number of instances exceeds the available capacity "
            f"of Capacity Reservation {target} ({fits} of {want})")
    elif block_type or market == "capacity-block":
        return 0, ("InvalidParameterCombination: capacity type CAPACITY_BLOCK needs a launch template whose "
                   "CapacityReservationTarget names the Capacity Block")
    else:
        failure = None
        if spec.get("CapacityReservationPreference", "open") == "open":
            left = want
            for cr in _reservations(region):
                held_in = placement_group_of(cr)
                if (left and cr.get("InstanceMatchCriteria") == "open" and _mismatch(cr, itype, zone) is None
                        and (held_in is None or held_in == group)):
                    fits = min(left, int(cr["AvailableInstanceCount"]))
                    if fits:
                        taken.append((cr, fits))
                        left -= fits
    for cr, n in taken:
        cr["AvailableInstanceCount"] = int(cr["AvailableInstanceCount"]) - n
    vars(ng)["rtui_reserved"] = [(cr["CapacityReservationId"], n) for cr, n in taken if n]
    return sum(n for _, n in taken), failure


def give_back(region: str, ng: Nodegroup) -> None:
    """The nodegroup is gone: its instances free the reservation slots they held."""
    held = dict(getattr(ng, "rtui_reserved", None) or [])
    for cr in _reservations(region):
        n = held.pop(cr["CapacityReservationId"], 0)
        cr["AvailableInstanceCount"] = int(cr["AvailableInstanceCount"]) + n
    vars(ng)["rtui_reserved"] = []
