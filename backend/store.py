"""RunStore: one versioned JSON record per run, written atomically with mode 0600.

The record is the memory that lets ``rtui --resume`` and ``rtui down`` work after a
crash: config, plan, step states, resource ids, job submissions, spool path and the
last telemetry snapshot. It never holds a secret. A record that fails to parse is
moved aside (never overwritten) and reported in one line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from backend.errors import OperationError, UserError
from backend.ledger import Ledger, ResourceRecord
from backend.paths import state_dir

# 2: ``resources`` is the ledger, {address: ResourceRecord}; 1 had an untyped dict.
SCHEMA_VERSION = 2
# How many successful durations of a step are kept for its ETA (the typical one is their median).
DURATIONS_KEPT = 5
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


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
    telemetry: dict[str, Any] | None = None


class RunRecord(BaseModel):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    created_at: float
    updated_at: float
    target: str
    cluster_name: str
    status: RunStatus = RunStatus.PLANNED
    config: dict[str, Any]
    plan: dict[str, Any] | None = None
    steps: dict[str, StepState] = Field(default_factory=dict)
    resources: dict[str, ResourceRecord] = Field(default_factory=dict)
    jobs: list[JobRecord] = Field(default_factory=list)
    spool_path: str
    telemetry: dict[str, Any] | None = None
    # What a layer decided once and keeps across plans (the AZs an aws run chose, why it moved).
    facts: dict[str, Any] = Field(default_factory=dict)

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


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """Bring an older record to SCHEMA_VERSION, one version at a time."""
    if data.get("schema_version") == 1:
        data = _v1_to_v2(data)
    return data


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


def new_run_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"r{stamp}-{secrets.token_hex(2)}"


class CorruptRecordError(OperationError):
    """A run record could not be read; it was moved aside."""


class RunLockedError(OperationError):
    """Another rtui process is applying or tearing down this run."""


class ClusterBusyError(RunLockedError):
    """Another rtui process is changing the same target's cluster of the same name."""


class RunStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or state_dir()
        self.runs_dir = self.root / "runs"
        self.spool_dir = self.root / "spool"
        self.lock_dir = self.root / "locks"
        self.corrupt_dir = self.root / "corrupt"

    # --- directories -------------------------------------------------------------------
    def ensure_writable(self) -> None:
        for d in (self.root, self.runs_dir, self.spool_dir, self.lock_dir):
            try:
                d.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise UserError(
                    f"state dir {d} is not writable ({exc.strerror})",
                    remedy="set RTUI_STATE_DIR or XDG_STATE_HOME to a writable folder",
                ) from None
            if not os.access(d, os.W_OK | os.X_OK):
                raise UserError(
                    f"state dir {d} is not writable",
                    remedy="set RTUI_STATE_DIR or XDG_STATE_HOME to a writable folder",
                )

    def path_for(self, run_id: str) -> Path:
        if not RUN_ID_PATTERN.fullmatch(run_id):
            shown = run_id if len(run_id) <= 40 else run_id[:40] + "…"
            raise UserError(f"invalid run id {shown!r}", remedy="see `rtui runs` for run ids")
        return self.runs_dir / f"{run_id}.json"

    def ledger(self, record: RunRecord) -> Ledger:
        return Ledger(record.resources, lambda: self.save(record))

    # --- records -----------------------------------------------------------------------
    def new(self, *, target: str, cluster_name: str, config: dict[str, Any]) -> RunRecord:
        """A record in memory only: nothing is written until the run changes something."""
        now = time.time()
        run_id = new_run_id(now)
        return RunRecord(
            run_id=run_id, created_at=now, updated_at=now, target=target, cluster_name=cluster_name,
            config=config, spool_path=str(self.spool_dir / f"{run_id}.log"),
        )

    def create(self, *, target: str, cluster_name: str, config: dict[str, Any]) -> RunRecord:
        record = self.new(target=target, cluster_name=cluster_name, config=config)
        self.save(record)
        return record

    def is_locked(self, run_id: str) -> bool:
        """Whether another process holds the run's lock (asking leaves no lock file behind)."""
        try:
            fd = os.open(self.lock_dir / f"{run_id}.lock", os.O_RDWR)
        except OSError:
            return False  # never locked, so nobody holds it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except OSError:
            return True
        finally:
            os.close(fd)

    def save(self, record: RunRecord) -> None:
        """Atomic replace: a crash leaves either the old or the new record, never half."""
        self.ensure_writable()
        record.updated_at = time.time()
        data = record.model_dump_json(indent=2).encode()
        target = self.path_for(record.run_id)
        fd, tmp = tempfile.mkstemp(prefix=f".{record.run_id}.", suffix=".tmp", dir=self.runs_dir)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def load(self, run_id: str) -> RunRecord:
        path = self.path_for(run_id)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise UserError(f"no run {run_id}", remedy="see `rtui runs` for run ids") from None
        except IsADirectoryError:
            raise OperationError(f"{path} is a directory, not a run record",
                                 remedy="move it out of the runs dir") from None
        try:
            data = json.loads(raw)
            version = data.get("schema_version")
            if isinstance(version, int) and version > SCHEMA_VERSION:
                raise OperationError(
                    f"run {run_id} was written by a newer rtui (record version {version}, this one reads "
                    f"up to {SCHEMA_VERSION}); left as it is", remedy="use the newer rtui for this run")
            data = migrate(data)
            if data.get("schema_version") != SCHEMA_VERSION:
                raise ValueError(f"schema version {version!r}, expected {SCHEMA_VERSION}")
            return RunRecord.model_validate(data)
        except (ValueError, ValidationError, AttributeError) as exc:
            kept = self._set_aside(path)
            reason = str(exc).splitlines()[0][:120]
            raise CorruptRecordError(
                f"run record {run_id} is corrupt ({reason}); kept it as {kept}",
                remedy="inspect or delete it; live resources can still be found with `rtui down`",
            ) from None

    def _set_aside(self, path: Path) -> Path:
        self.corrupt_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        dest = self.corrupt_dir / f"{path.name}.{int(time.time())}"
        os.replace(path, dest)
        return dest

    def list(self) -> tuple[list[RunRecord], list[str]]:
        """All readable records (newest first) and one warning per corrupt record."""
        records: list[RunRecord] = []
        warnings: list[str] = []
        if not self.runs_dir.is_dir():
            return records, warnings
        self._sweep_temp_files()
        for path in sorted(self.runs_dir.glob("*.json")):
            if not path.is_file() or not RUN_ID_PATTERN.fullmatch(path.stem):
                continue
            try:
                records.append(self.load(path.stem))
            except OperationError as exc:
                warnings.append(str(exc))
        records.sort(key=lambda r: r.created_at, reverse=True)
        return records, warnings

    def _sweep_temp_files(self, older_than_s: float = 600.0) -> None:
        """A save killed before its rename leaves ``.ID.*.tmp``; one that old is no save in flight."""
        cutoff = time.time() - older_than_s
        for tmp in self.runs_dir.glob(".*.tmp"):
            with contextlib.suppress(OSError):
                if tmp.is_file() and tmp.stat().st_mtime < cutoff:
                    tmp.unlink()

    def latest(self) -> RunRecord:
        records, _ = self.list()
        if not records:
            raise UserError("no runs yet", remedy="start one with `rtui` or `rtui up --yes`")
        return records[0]

    def find_active(self, target: str, cluster_name: str) -> RunRecord | None:
        records, _ = self.list()
        for record in records:
            if record.active and record.target == target and record.cluster_name == cluster_name:
                return record
        return None

    def resolve(self, run_id: str | None) -> RunRecord:
        return self.load(run_id) if run_id else self.latest()

    # --- step durations on this machine (for ETAs) ---------------------------------------
    @property
    def durations_path(self) -> Path:
        return self.root / "durations.json"

    def durations(self) -> dict[str, float]:
        """{timing key: typical seconds} from the last runs of this state dir (the median of the
        last few successful ones); {} when none were kept or the file is unreadable."""
        try:
            data = json.loads(self.durations_path.read_bytes())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        typical = {}
        for key, seen in data.items():
            values = [float(v) for v in seen if isinstance(v, int | float) and v >= 0] if isinstance(seen, list) else []
            if values:
                typical[str(key)] = statistics.median(values)
        return typical

    def record_duration(self, key: str, seconds: float) -> None:
        """Keep how long a step took (its last DURATIONS_KEPT); a failure to write only costs the ETA."""
        try:
            self.ensure_writable()
            try:
                data = json.loads(self.durations_path.read_bytes())
            except (OSError, ValueError):
                data = {}
            if not isinstance(data, dict):
                data = {}
            kept = data.get(key)
            seen: list[Any] = kept if isinstance(kept, list) else []
            data[key] = [*seen, float(f"{seconds:.3g}")][-DURATIONS_KEPT:]  # 3 digits: a per-step time is ms
            fd, tmp = tempfile.mkstemp(prefix=".durations.", suffix=".tmp", dir=self.root)
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh)
            os.replace(tmp, self.durations_path)
        except (OSError, UserError):
            return

    # --- locking -----------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, run_id: str) -> Iterator[None]:
        """Exclusive per-run lock; released by the kernel if the holder is killed."""
        self.path_for(run_id)  # validates the id before it becomes a file name

        def busy(holder: str) -> OperationError:
            return RunLockedError(f"run {run_id} is in use by another rtui (pid {holder.split()[0]})",
                                  remedy=f"wait for it, or watch it with `rtui logs {run_id} --follow`")

        with self._flock(f"{run_id}.lock", str(os.getpid()), busy):
            yield

    @contextlib.contextmanager
    def cluster_lock(self, target: str, cluster_name: str, run_id: str) -> Iterator[None]:
        """One rtui changing a target's cluster of this name at a time, whichever run it works for."""

        def busy(holder: str) -> OperationError:
            parts = holder.split()
            other = parts[1] if len(parts) > 1 else "?"
            return ClusterBusyError(
                f"cluster {cluster_name} on {target} is being changed by run {other} "
                f"(pid {parts[0] if parts else '?'})",
                remedy=f"wait for it, or watch it with `rtui logs {other} --follow`")

        with self._flock(f"cluster-{target}-{cluster_name}.lock", f"{os.getpid()} {run_id}", busy):
            yield

    @contextlib.contextmanager
    def _flock(self, name: str, holder: str, busy: Any) -> Iterator[None]:
        self.ensure_writable()
        path = self.lock_dir / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                raise busy(os.pread(fd, 128, 0).decode(errors="replace").strip() or "?") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode(), 0)
            yield
        finally:
            os.close(fd)
