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
import secrets
import tempfile
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from backend.errors import OperationError, UserError
from backend.paths import state_dir

SCHEMA_VERSION = 1


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


class JobRecord(BaseModel):
    submission_id: str
    submitted_at: float
    spec_hash: str
    status: str = "PENDING"
    message: str = ""
    ended_at: float | None = None


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
    resources: dict[str, Any] = Field(default_factory=dict)
    jobs: list[JobRecord] = Field(default_factory=list)
    spool_path: str
    telemetry: dict[str, Any] | None = None

    @property
    def current_job(self) -> JobRecord | None:
        return self.jobs[-1] if self.jobs else None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES


def new_run_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"r{stamp}-{secrets.token_hex(2)}"


class CorruptRecordError(OperationError):
    """A run record could not be read; it was moved aside."""


class RunLockedError(OperationError):
    """Another rtui process is applying or tearing down this run."""


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
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise UserError(f"invalid run id {run_id!r}", remedy="see `rtui runs` for run ids")
        return self.runs_dir / f"{run_id}.json"

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
        try:
            with self.lock(run_id):
                return False
        except RunLockedError:
            return True

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
        try:
            data = json.loads(raw)
            if data.get("schema_version") != SCHEMA_VERSION:
                raise ValueError(f"schema version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}")
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
        for path in sorted(self.runs_dir.glob("*.json")):
            try:
                records.append(self.load(path.stem))
            except CorruptRecordError as exc:
                warnings.append(str(exc))
        records.sort(key=lambda r: r.created_at, reverse=True)
        return records, warnings

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

    # --- locking -----------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, run_id: str) -> Iterator[None]:
        """Exclusive per-run lock; released by the kernel if the holder is killed."""
        self.ensure_writable()
        path = self.lock_dir / f"{run_id}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                raise RunLockedError(
                    f"run {run_id} is in use by another rtui (pid {holder})",
                    remedy=f"wait for it, or watch it with `rtui logs {run_id} --follow`",
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
        finally:
            os.close(fd)
