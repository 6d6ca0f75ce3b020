"""RunStore: one versioned JSON record per run, written atomically with mode 0600.

The record is the memory that lets ``rtui --resume`` and ``rtui down`` work after a
crash: config, plan, step states, resource ids, job submissions, spool path and the
last telemetry snapshot (its types: ``backend.record``). It never holds a secret.

Reading never changes the store: a record that fails to parse is reported in one line, where
it lies, every time it is read or listed, and stays there until ``set_aside_corrupt`` (the
explicit ``rtui runs --set-aside-corrupt``) moves it to ``corrupt/``. Nothing is ever overwritten.
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
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from backend.config import RunConfig
from backend.errors import OperationError, UserError
from backend.ledger import Ledger
from backend.paths import state_dir
from backend.record import (
    ACTIVE_STATUSES,
    SCHEMA_VERSION,
    JobRecord,
    JobState,
    RunFacts,
    RunRecord,
    RunStatus,
    StepState,
    StepStatus,
    TelemetrySnapshot,
    current_timing_key,
    migrate,
)

# The record's types live in backend.record; most callers know them from here.
__all__ = ["ACTIVE_STATUSES", "SCHEMA_VERSION", "ClusterBusyError", "CorruptRecordError", "JobRecord", "JobState",
           "RunFacts", "RunLockedError", "RunRecord", "RunStatus", "RunStore", "StepState", "StepStatus",
           "TelemetrySnapshot", "migrate", "new_run_id"]

# How many successful durations of a step are kept for its ETA (the typical one is their median).
DURATIONS_KEPT = 5
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def new_run_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"r{stamp}-{secrets.token_hex(2)}"


class CorruptRecordError(OperationError):
    """A run record could not be read; it was left where it is."""


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
    def new(self, config: RunConfig) -> RunRecord:
        """A record in memory only: nothing is written until the run changes something."""
        now = time.time()
        run_id = new_run_id(now)
        return RunRecord(
            run_id=run_id, created_at=now, updated_at=now, target=config.target, cluster_name=config.cluster_name,
            config=config, spool_path=str(self.spool_dir / f"{run_id}.log"),
        )

    def create(self, config: RunConfig) -> RunRecord:
        record = self.new(config)
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

    def save(self, record: RunRecord, *, durable: bool = True) -> None:
        """Atomic replace: a crash leaves either the old or the new record, never half.

        ``durable=False`` skips the fsync: still atomic for a process that dies (the replace is), but
        the OS may lose it in a power cut, leaving the last durable record. For what a later save
        will repeat anyway (a step's progress message), not for what the run's safety rests on."""
        self.ensure_writable()
        self._sweep_temp_files()  # at write time: listing and reading change nothing
        record.updated_at = time.time()
        data = record.model_dump_json(indent=2).encode()
        target = self.path_for(record.run_id)
        fd, tmp = tempfile.mkstemp(prefix=f".{record.run_id}.", suffix=".tmp", dir=self.runs_dir)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                if durable:
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
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise self._corrupt(run_id, path, f"{where}: {first.get('msg', '')}") from None
        except (ValueError, AttributeError) as exc:
            raise self._corrupt(run_id, path, str(exc)) from None

    @staticmethod
    def _corrupt(run_id: str, path: Path, reason: str) -> CorruptRecordError:
        reason = (reason.splitlines() or ["unreadable"])[0][:120]
        return CorruptRecordError(
            f"run record {run_id} is corrupt ({reason}); left as it is at {path}",
            remedy="inspect it, or move it out of the way with `rtui runs --set-aside-corrupt`; "
                   "`rtui down` still finds live resources")

    def set_aside_corrupt(self) -> list[Path]:
        """Move every record that cannot be read to ``corrupt/`` (never overwritten, never deleted);
        where each went. The only call that moves a record: reading and listing never do."""
        moved: list[Path] = []
        for path in self._record_paths():
            try:
                self.load(path.stem)
            except CorruptRecordError:
                self.corrupt_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                dest = self.corrupt_dir / f"{path.name}.{int(time.time())}"
                while dest.exists():
                    dest = dest.with_name(dest.name + "_")
                os.replace(path, dest)
                moved.append(dest)
            except OperationError:
                continue  # a newer rtui's record, a directory: readable elsewhere, or not ours to move
        return moved

    def _record_paths(self) -> list[Path]:
        if not self.runs_dir.is_dir():
            return []
        return [p for p in sorted(self.runs_dir.glob("*.json"))
                if p.is_file() and RUN_ID_PATTERN.fullmatch(p.stem)]

    def list(self) -> tuple[list[RunRecord], list[str]]:
        """All readable records (newest first) and one warning per unreadable one; changes nothing."""
        records: list[RunRecord] = []
        warnings: list[str] = []
        for path in self._record_paths():
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
                typical[current_timing_key(str(key))] = statistics.median(values)
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
