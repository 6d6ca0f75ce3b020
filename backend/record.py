"""The run record, typed end to end: what ``RunStore`` keeps of a run between rtui processes.

The record is the memory that lets ``rtui --resume`` and ``rtui down`` work after a crash: the
config the run was applied with (a ``RunConfig``), the plan (a ``Plan``), step states, the ledger
of resources, job submissions, the last telemetry snapshot and the facts a layer decided once
(``RunFacts``). It never holds a secret. Records written by an older rtui are brought to
``SCHEMA_VERSION`` by ``migrate``, one version at a time (``tests/data/records`` holds samples).
"""

from __future__ import annotations

import time
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, SerializeAsAny, ValidationError, model_validator

from backend import registry
from backend.config import RunConfig, config_model, field_owners
from backend.ledger import ResourceRecord
from backend.resources import Leftover, Plan

# 5: one spelling for the kube layer: its layer "kube" (4: "kubernetes"), its addresses "kube." (4: "k8s."),
#    its kinds "kube-" (4: "k8s-").
# 4: the config holds its target's fields only (its target's config model), the facts its target's own under
#    "own" (its facts model); 3 held every target's fields, and the aws target's facts beside the common ones.
# 3: config, plan, telemetry and facts are typed; teardown steps have their own map (2 prefixed their
#    ids with "teardown:"); steps and resources carry their layer.
# 2: ``resources`` is the ledger, {address: ResourceRecord}; 1 had an untyped dict.
SCHEMA_VERSION = 5


class RunStatus(StrEnum):
    PLANNED = "planned"
    APPLYING = "applying"
    UP = "up"
    FAILED = "failed"
    TEARING_DOWN = "tearing_down"
    DOWN = "down"


ACTIVE_STATUSES = frozenset({RunStatus.PLANNED, RunStatus.APPLYING, RunStatus.UP, RunStatus.FAILED,
                             RunStatus.TEARING_DOWN})


class StepStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class StepState(BaseModel):
    status: StepStatus = StepStatus.PENDING
    title: str = ""
    # The layer whose resource the step works on; "" for a step of no layer (the job's follow, the sweep).
    layer: str = ""
    attempts: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    message: str = ""
    error: str | None = None
    remedy: str | None = None

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at


class JobState(StrEnum):
    """A Ray job's status, as the Jobs API names it."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)


# --- telemetry, as the record keeps it (backend.telemetry.Telemetry.snapshot) ---------------------
class TransportRecord(BaseModel):
    """The NCCL transport verdict (``training.logparse.verdict.Verdict.to_dict``)."""

    transport: str = "unknown"
    basis: str | None = None
    label: str = ""
    reason: str = ""
    nccl_version: str | None = None
    plugin: str | None = None
    plugin_version: str | None = None
    provider: str | None = None
    network: str | None = None
    nodes: int | None = None
    nodes_basis: str | None = None
    ranks: int | None = None
    hosts: dict[str, str] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)
    decided_by: list[str] = Field(default_factory=list)


class MetricRecord(BaseModel):
    """One training step (``backend.telemetry.MetricPoint``)."""

    step: int | None = None
    ts: float | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    steps_per_s: float | None = None
    step_time_s: float | None = None
    mfu: float | None = None


class MetricsRecord(BaseModel):
    records: int = 0
    latest: MetricRecord | None = None
    points: list[MetricRecord] = Field(default_factory=list)
    # The training program's RTUI_SUMMARY line, as it wrote it (its keys are that program's).
    summary: dict[str, JsonValue] | None = None


class SpoolPosition(BaseModel):
    path: str | None = None
    offset: int = 0


class TelemetrySnapshot(BaseModel):
    """What the record keeps of a job's telemetry (the spool, not this, is the source of truth)."""

    lines: int = 0
    transport: TransportRecord = Field(default_factory=TransportRecord)
    metrics: MetricsRecord = Field(default_factory=MetricsRecord)
    spool: SpoolPosition = Field(default_factory=SpoolPosition)


# --- facts: what a layer decided once and keeps across plans --------------------------------------
class StoppedWhileIdle(BaseModel):
    """The local cluster stopped itself after ``idle_s`` without a job (issue 26)."""

    at: float
    idle_s: float
    dir: str | None = None


F = TypeVar("F", bound="Facts")


class Facts(BaseModel):
    """A target's own facts: what its layers decided once and keep across plans (the aws target's AZs).
    A target's ``facts_model`` subclasses it; this base keeps, as written, the facts of a target that is
    not installed now (nothing reads them)."""

    model_config = ConfigDict(extra="allow", defer_build=True)

    @classmethod
    def of(cls: type[F], facts: RunFacts) -> F:
        """The run's own facts as this model (a run made before any were kept gets this model's defaults)."""
        if not isinstance(facts.own, cls):
            facts.own = cls.model_validate(facts.own.model_dump(mode="json"))
        return facts.own


class NoFacts(Facts):
    """The facts of a target that keeps none of its own (``Target.facts_model``'s default)."""

    model_config = ConfigDict(extra="forbid")


class RunFacts(BaseModel):
    """What a layer decided once and keeps across plans: what every target's run keeps, and its target's own."""

    model_config = ConfigDict(extra="forbid")

    # Every target
    sweep: list[Leftover] | None = None  # what the last orphan sweep still found (None: no sweep yet)
    stopped_while_idle: StoppedWhileIdle | None = None  # local
    # Where a layer put the run's data when the user named no --storage-path (the aws layer's bucket,
    # ``s3://<bucket>/runs``): read by the job and `rtui model/status/down`.
    storage_path: str | None = None
    # What `down` measured of the data it kept where rtui cannot look for free (a kube volume: a pod
    # reads it): DataUsage.to_dict(); cleared by `down --delete-data`.
    kept_data: dict[str, JsonValue] | None = None
    # The run's target's own facts, typed by it (``Target.facts_model``): its code reads them as
    # ``AwsFacts.of(record.facts)``.
    own: SerializeAsAny[Facts] = Field(default_factory=Facts)


class JobRecord(BaseModel):
    """One submission of the run's job. Each job has its own log spool and telemetry snapshot;
    a record written before that (``spool_path`` None) shares the run's spool."""

    submission_id: str
    submitted_at: float
    spec_hash: str
    status: JobState = JobState.PENDING
    message: str = ""
    ended_at: float | None = None
    spool_path: str | None = None
    telemetry: TelemetrySnapshot | None = None


class RejectedConfig(BaseModel):
    """A recorded config this rtui does not accept (a field it no longer has, a bound it tightened):
    kept as written, beside the defaults the run falls back to, so ``down`` still works and nothing is lost."""

    written: dict[str, JsonValue]
    reason: str


class RunRecord(BaseModel):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    created_at: float
    updated_at: float
    target: str
    cluster_name: str
    status: RunStatus = RunStatus.PLANNED
    config: SerializeAsAny[RunConfig]  # its target's config model, whole
    rejected_config: RejectedConfig | None = None
    plan: Plan | None = None
    steps: dict[str, StepState] = Field(default_factory=dict)  # the apply's, by step id (the change's address)
    teardown_steps: dict[str, StepState] = Field(default_factory=dict)  # the last teardown's, by step id
    resources: dict[str, ResourceRecord] = Field(default_factory=dict)
    jobs: list[JobRecord] = Field(default_factory=list)
    spool_path: str
    telemetry: TelemetrySnapshot | None = None
    facts: RunFacts = Field(default_factory=RunFacts)

    @model_validator(mode="before")
    @classmethod
    def _the_targets_own_models(cls, data: Any) -> Any:
        """The config as its target's config model, and the facts' ``own`` as its facts model (a target not
        installed now: the common models, its facts kept as written)."""
        if not isinstance(data, dict):
            return data
        data = cls._keep_a_rejected_config(data)
        target = data.get("target")
        model = registry.load(target).facts_model if isinstance(target, str) and registry.known(target) else Facts
        facts = data.get("facts")
        if isinstance(facts, RunFacts):
            facts = facts.model_copy()
        elif isinstance(facts, dict):
            facts = RunFacts.model_validate(facts)
        else:
            facts = RunFacts()
        if type(facts.own) is not model:
            facts.own = model.model_validate(facts.own.model_dump(mode="json"))
        return {**data, "facts": facts}

    @classmethod
    def _keep_a_rejected_config(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A config this rtui rejects does not make the record unreadable: the run keeps its target and
        cluster name (what teardown needs) and the config as written, with why it was refused."""
        if isinstance(data.get("config"), RunConfig):
            return data
        written = data.get("config")
        if not isinstance(written, dict):
            return data
        target = data.get("target")
        model = config_model(target) if isinstance(target, str) and registry.known(target) else RunConfig
        try:
            config = model.model_validate(written)
        except ValidationError as exc:
            fallback: dict[str, Any] = {"target": target, "cluster_name": data.get("cluster_name")}
            try:
                config = model.model_validate(fallback)
            except ValidationError:  # its target is not installed now: kept unchecked, so the run is still
                config = model.model_construct(**fallback)  # listed and refused in one line when opened
            return {**data, "config": config, "rejected_config": {"written": written, "reason": _first_error(exc)}}
        return {**data, "config": config}

    def use_config(self, config: RunConfig) -> None:
        """The run goes on with ``config`` (applied or reconfigured): a rejected one is history."""
        self.config = config
        self.rejected_config = None

    @property
    def current_job(self) -> JobRecord | None:
        return self.jobs[-1] if self.jobs else None

    def job(self, number: int | None = None) -> JobRecord | None:
        """Job ``number`` (1 is the first submission), or the current one when None."""
        if number is None:
            return self.current_job
        return self.jobs[number - 1] if 1 <= number <= len(self.jobs) else None

    def job_spool_path(self, job: JobRecord | None = None) -> str:
        """Where a job's log is spooled: its own file; the run's first spool for none yet or an old record."""
        job = job if job is not None else self.current_job
        return job.spool_path if job is not None and job.spool_path else self.spool_path

    def next_job_spool_path(self) -> str:
        """The spool of the job about to be submitted: the first keeps the run's spool path, each
        later one a file of its own in the run's folder beside it (no run id can name that folder's files)."""
        if not self.jobs:
            return self.spool_path
        base = Path(self.spool_path)
        return str(base.parent / self.run_id / f"job-{len(self.jobs) + 1}.log")

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', '')}"[:160]


# --- migration ------------------------------------------------------------------------------------
def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """Bring an older record to SCHEMA_VERSION, one version at a time."""
    if data.get("schema_version") == 1:
        data = _v1_to_v2(data)
    if data.get("schema_version") == 2:
        data = _v2_to_v3(data)
    if data.get("schema_version") == 3:
        data = _v3_to_v4(data)
    if data.get("schema_version") == 4:
        data = _v4_to_v5(data)
    return data


# rtui 4 spelled the kube layer three ways. The old words, still found in a record, the durations kept
# and a user's ``--until``, read as the new ones.
_V4_LAYERS = {"kubernetes": "kube"}
_V4_ADDRESS, _V4_KIND = ("k8s.", "kube."), ("k8s-", "kube-")


def current_address(address: str) -> str:
    old, new = _V4_ADDRESS
    return new + address.removeprefix(old) if address.startswith(old) else address


def current_kind(kind: str) -> str:
    old, new = _V4_KIND
    return new + kind.removeprefix(old) if kind.startswith(old) else kind


def current_name(name: str) -> str:
    """An address or a layer (``--until``'s argument) in this rtui's words."""
    return _V4_LAYERS.get(name, current_address(name))


def current_timing_key(key: str) -> str:
    """A step's timing key (``target/kind/action``) in this rtui's words."""
    parts = key.split("/")
    return "/".join([parts[0], current_kind(parts[1]), *parts[2:]]) if len(parts) >= 2 else key


def _v4_to_v5(data: dict[str, Any]) -> dict[str, Any]:
    """v4 named the kube layer "kubernetes", its addresses "k8s.…" and its kinds "k8s-…"."""
    def entry(item: Any) -> Any:
        if not isinstance(item, dict):
            return item
        out = dict(item)
        if isinstance(out.get("layer"), str):
            out["layer"] = _V4_LAYERS.get(out["layer"], out["layer"])
        if isinstance(out.get("kind"), str):
            out["kind"] = current_kind(out["kind"])
        if isinstance(out.get("address"), str):
            out["address"] = current_address(out["address"])
        if isinstance(out.get("depends_on"), list):
            out["depends_on"] = [current_address(d) if isinstance(d, str) else d for d in out["depends_on"]]
        if isinstance(out.get("title"), str):  # a step's ("create k8s.raycluster")
            out["title"] = " ".join(current_address(w) for w in out["title"].split(" "))
        return out

    def by_address(items: Any) -> Any:
        return {current_address(k): entry(v) for k, v in items.items()} if isinstance(items, dict) else items

    plan = data.get("plan")
    if isinstance(plan, dict) and isinstance(plan.get("changes"), list):
        plan = {**plan, "changes": [entry(c) for c in plan["changes"]]}
    return {**data, "plan": plan, "steps": by_address(data.get("steps")),
            "teardown_steps": by_address(data.get("teardown_steps")), "resources": by_address(data.get("resources")),
            "schema_version": 5}


# The facts a v3 record kept beside every target's (the aws target's); an installed target's under "target_facts".
_V3_TARGET_FACTS = ("api_cidrs", "create_attempts", "gpu_az", "network_azs", "system_disk_gb", "reservation",
                    "failed_azs", "az_moves", "spot_fallback", "spot_risk", "data_bucket")


def _v3_to_v4(data: dict[str, Any]) -> dict[str, Any]:
    """v3 held every target's fields in each run's config, and the aws target's facts in every run's; v4
    holds its target's only, its facts under ``facts.own``. The other targets' fields go (a v3 record holds
    their defaults, or values its target never read); a field no target knows stays, for the record's check
    to keep the config as written and say why it is refused."""
    config, target, facts = data.get("config"), data.get("target"), data.get("facts")
    known = isinstance(target, str) and registry.known(target)
    if isinstance(config, dict) and known:
        own, fields = config_model(str(target)).model_fields, field_owners()
        config = {k: v for k, v in config.items() if k in own or k not in fields}
    if isinstance(facts, dict):
        kept = {k: facts[k] for k in _V3_TARGET_FACTS if k in facts}
        own_facts = {**(facts.get("target_facts") or {}), **kept}
        if known:
            own_facts = {k: v for k, v in own_facts.items() if k in registry.load(target).facts_model.model_fields}
        facts = {k: v for k, v in facts.items() if k not in _V3_TARGET_FACTS and k != "target_facts"}
        facts["own"] = own_facts
    return {**data, "config": config, "facts": facts, "schema_version": 4}


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v1 kept the local cluster's facts loose in ``resources``; v2 keeps them per address."""
    old = data.get("resources") or {}
    ledger: dict[str, Any] = {}
    now = data.get("updated_at") or time.time()
    if isinstance(old, dict) and old.get("temp_dir"):
        outputs = {k: old[k] for k in ("ports", "gcs_address", "dashboard_url", "shape", "head_log", "head")
                   if k in old}
        alive = bool(old.get("head"))
        ledger["local.ray-head"] = {"kind": "ray-head", "id": old["temp_dir"],
                                    "status": "ready" if alive else "deleted", "outputs": outputs,
                                    "created_at": data.get("created_at", now), "updated_at": now}
        for i, worker in enumerate(old.get("workers") or []):
            ledger[f"local.ray-worker.{i}"] = {"kind": "ray-worker", "id": old["temp_dir"], "status": "ready",
                                               "outputs": {"proc": worker}, "created_at": now, "updated_at": now}
    jobs = data.get("jobs") or []
    if jobs and isinstance(jobs[-1], dict) and jobs[-1].get("submission_id"):
        ledger["ray.job.train"] = {"kind": "ray-job", "id": jobs[-1]["submission_id"], "status": "ready",
                                   "outputs": {"spec_hash": jobs[-1].get("spec_hash")},
                                   "created_at": jobs[-1].get("submitted_at", now), "updated_at": now}
    return {**data, "resources": ledger, "schema_version": 2}


# The layer of each address prefix rtui 2 wrote (only to give old steps and resources their layer: an
# address's layer is never read from its name otherwise).
_V2_LAYERS = {"aws": "aws", "k8s": "kubernetes", "local": "local-ray", "ray": "ray-job"}
_TEARDOWN_PREFIX_V2 = "teardown:"


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """v2: teardown step ids prefixed "teardown:" in ``steps``; no layer on steps or resources; the
    telemetry snapshot's version under "schema"; an AZ move's origin under "from"."""
    plan = data.get("plan") if isinstance(data.get("plan"), dict) else None
    layer_of = {c.get("address"): c.get("layer") for c in (plan or {}).get("changes") or [] if isinstance(c, dict)}

    def layer(address: str) -> str:
        """The plan's word for it, else the layer rtui 2 named by that prefix; "" for "sweep", "run"."""
        if "." not in address:
            return ""
        return str(layer_of.get(address) or _V2_LAYERS.get(address.split(".", 1)[0], ""))

    steps: dict[str, Any] = {}
    teardown: dict[str, Any] = {}
    for sid, state in (data.get("steps") or {}).items():
        into, step_id = (teardown, sid.removeprefix(_TEARDOWN_PREFIX_V2)) if sid.startswith(_TEARDOWN_PREFIX_V2) \
            else (steps, sid)
        into[step_id] = {**state, "layer": layer(step_id)} if isinstance(state, dict) else state
    resources = {address: {**entry, "layer": layer(address)} if isinstance(entry, dict) else entry
                 for address, entry in (data.get("resources") or {}).items()}
    facts = dict(data.get("facts") or {})
    if isinstance(facts.get("az_moves"), list):
        facts["az_moves"] = [_renamed(m, "from", "from_az") for m in facts["az_moves"]]
    jobs = [{**j, "telemetry": _telemetry_v3(j.get("telemetry"))} if isinstance(j, dict) else j
            for j in data.get("jobs") or []]
    return {**data, "steps": steps, "teardown_steps": teardown, "resources": resources, "facts": facts,
            "jobs": jobs, "telemetry": _telemetry_v3(data.get("telemetry")), "schema_version": 3}


def _renamed(item: Any, old: str, new: str) -> Any:
    if not isinstance(item, dict) or old not in item:
        return item
    return {new if k == old else k: v for k, v in item.items()}


def _telemetry_v3(snapshot: Any) -> Any:
    """v2's snapshot carried its own version (``schema``: 1); the record's version now covers it."""
    if isinstance(snapshot, dict) and snapshot.get("schema") == 1:
        return {k: v for k, v in snapshot.items() if k != "schema"}
    return snapshot
