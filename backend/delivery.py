"""The run's product on the backend side: where its data lives, the model in it, fetching and keeping it.

A run's data (checkpoints and exported model directories, ``training.export``) lives in a
``DataStore``: a directory under the run's state dir on the local target, or the run's own prefix
``<--storage-path>/<run id>/`` when the user names shared storage (``S3Store`` for ``s3://``), so
runs that share a bucket prefix never see, fetch or delete each other's data. Each store can say what it holds
(``usage``), find the newest complete model (a directory whose ``rtui_model.json`` lists files that
are all there; an interrupted export is named ``.<name>.incomplete-*`` and never found), copy it to a
local directory (``fetch``) and delete everything (``delete``, only on ``--delete-data``).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from backend.clients import Clients
from backend.errors import OperationError
from backend.resources import CheckResult, CheckStatus
from backend.safepath import already_there, checked_target, partial_file
from training.export import INCOMPLETE, MODEL_MARKER, ExportInfo, find_models, read_marker, split_s3

LOAD_HINT = "from transformers import AutoModelForCausalLM; model = AutoModelForCausalLM.from_pretrained('{path}')"


@dataclass(frozen=True)
class DataUsage:
    """What a store holds: bytes, and how many models and checkpoints; the monthly cost where there is one."""

    where: str
    bytes: int
    models: int
    checkpoints: int
    monthly_cost: float | None = None

    @property
    def empty(self) -> bool:
        return self.models == 0 and self.checkpoints == 0

    def describe(self) -> str:
        parts = [f"{self.models:,} model{'s' * (self.models != 1)}",
                 f"{self.checkpoints:,} checkpoint{'s' * (self.checkpoints != 1)}", human_bytes(self.bytes)]
        if self.monthly_cost is not None:
            parts.append(f"${self.monthly_cost:,.2f}/month" if self.monthly_cost >= 0.01 or not self.monthly_cost
                         else "under $0.01/month")
        return f"{self.where}: " + ", ".join(parts)

    def to_dict(self) -> dict[str, str | int | float | None]:
        return {"where": self.where, "bytes": self.bytes, "models": self.models, "checkpoints": self.checkpoints,
                "monthly_cost": self.monthly_cost}


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1000
    return f"{n} B"


class DataStore(Protocol):
    """One place a run's data lives: a local dir, an S3 prefix, a kube volume. Its methods are async: a
    store that reaches a cluster does it with the session's own client, on the session's loop; one that
    blocks (files, boto3) does it in a thread. ``fetch``'s ``progress`` may be called from that thread."""

    uri: str

    async def usage(self) -> DataUsage: ...

    async def latest_model(self) -> ExportInfo | None: ...

    async def fetch(self, model: ExportInfo, to: Path,
                    progress: Callable[[int, int], None] | None = None) -> list[str]: ...

    async def delete(self) -> None: ...


class LocalDirStore:
    """The local target's run data: ``<state dir>/data/<run id>/`` (0700), kept after `down`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.uri = str(path)

    def _model_roots(self) -> list[Path]:
        """The dirs model directories are written under: the storage root and each Ray Train run name in it."""
        if not self.path.is_dir():
            return []
        return [self.path, *sorted(p for p in self.path.iterdir() if p.is_dir() and not p.name.startswith("."))]

    def models(self) -> list[ExportInfo]:
        found = [m for root in self._model_roots() for m in find_models(str(root))]
        return sorted(found, key=lambda m: (m.final, m.step, os.path.getmtime(m.uri)), reverse=True)

    def newest_model(self) -> ExportInfo | None:
        models = self.models()
        return models[0] if models else None

    def measure(self) -> DataUsage:
        """``usage``, blocking (files only): for a caller with no loop (`rtui status` of every run)."""
        if not self.path.exists():
            return DataUsage(self.uri, 0, 0, 0)
        size = sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file() and not f.is_symlink())
        checkpoints = sum(1 for _ in self.path.rglob("rtui_checkpoint.json"))
        return DataUsage(self.uri, size, len(self.models()), checkpoints)

    async def latest_model(self) -> ExportInfo | None:
        return await asyncio.to_thread(self.newest_model)

    async def usage(self) -> DataUsage:
        return await asyncio.to_thread(self.measure)

    async def fetch(self, model: ExportInfo, to: Path,
                    progress: Callable[[int, int], None] | None = None) -> list[str]:
        return await asyncio.to_thread(copy_model_dir, Path(model.uri), model, to, progress)

    async def delete(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self.path, ignore_errors=True)


# S3 Standard in us-east-1, first 50 TB: $0.023 per GB-month, where AWS bills a GB as 2^30 bytes
# (Amazon S3 pricing page; "GB-Month" in the AWS billing glossary). Other regions differ by a few cents.
S3_STANDARD_PER_GIB_MONTH = 0.023


def effective_storage_path(storage_path: str | None, made: str | None) -> str | None:
    """``--storage-path``, else the storage a layer of the run made for it (``RunFacts.storage_path``),
    else None."""
    return storage_path or made or None


def run_storage_uri(storage_path: str, run_id: str) -> str:
    """Where one run's checkpoints and models go under the user's ``--storage-path``: its own prefix."""
    return f"{storage_path.rstrip('/')}/{run_id}"


def aws_client(service: str, profile: str | None, clients: Clients | None) -> Any:
    """The boto3 client of ``service`` for ``profile`` (its region, else us-east-1: S3 and STS answer there for
    any bucket), from the session's ``clients`` when there is a session (one per session, closed with it)."""
    def made() -> Any:
        # lazy: boto3 (~400 ms) only for s3:// storage; a local run never loads it
        from backend.boto import boto3_session

        aws = boto3_session(profile)
        return aws.client(service, region_name=aws.region_name or "us-east-1")

    return clients.get((service, profile), made) if clients is not None else made()


class S3Store:
    """A run's data under ``s3://bucket/prefix/<run id>/``, read with the user's own AWS credentials
    (boto3's chain: profile, environment, SSO; ``AWS_ENDPOINT_URL`` for an S3-compatible endpoint).

    A model directory there is complete when its ``rtui_model.json`` exists and every file it lists is
    there: the training program uploads the marker last (``training.export.upload_dir``)."""

    def __init__(self, uri: str, profile: str | None = None, *, bucket_goes_with_data: bool = False,
                 clients: Clients | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.bucket, self.prefix = split_s3(self.uri)
        self.profile = profile
        # The run's own bucket (aws, no --storage-path) is deleted with its data: gone, it holds nothing.
        # A user's bucket that is missing is an error to show (a typo, another account).
        self.bucket_goes_with_data = bucket_goes_with_data
        self._clients = clients  # the session's: its S3 client is shared by its stores and closed with it
        self._s3: Any = None

    def _client(self) -> Any:
        if self._s3 is None:
            self._s3 = aws_client("s3", self.profile, self._clients)
        return self._s3

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # lazy: botocore only for s3:// storage
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(*args, **kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", "")) or str(exc)
            raise OperationError(f"{what} {self.uri} failed: {code}",
                                 remedy="check that your AWS credentials may read and list it "
                                        "(s3:GetObject, s3:ListBucket), then run the same command again") from None
        except BotoCoreError as exc:
            raise OperationError(f"{what} {self.uri} failed: {exc}",
                                 remedy="check your AWS credentials and network, then run it again") from None

    def _objects(self) -> dict[str, tuple[int, float]]:
        """Every object under the run's prefix: key relative to it -> (size, last modified)."""
        base = f"{self.prefix}/" if self.prefix else ""

        def listing() -> dict[str, tuple[int, float]]:  # pages: one call a thousand keys
            # lazy: botocore only for s3:// storage
            from botocore.exceptions import ClientError

            found = {}
            try:
                for page in self._client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
                    for obj in page.get("Contents", []):
                        found[obj["Key"][len(base):]] = (int(obj["Size"]), obj["LastModified"].timestamp())
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "NoSuchBucket" or not self.bucket_goes_with_data:
                    raise
                return {}  # the run's own bucket went with `down --delete-data`: it holds nothing
            return found

        return dict(self._call("listing", listing))

    def _key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def models(self) -> list[ExportInfo]:
        objects = self._objects()
        found: list[tuple[ExportInfo, float]] = []
        for key, (_size, modified) in objects.items():
            if not key.endswith(f"/{MODEL_MARKER}") and key != MODEL_MARKER:
                continue
            directory = key[: -len(MODEL_MARKER)].rstrip("/")
            if INCOMPLETE in directory.rsplit("/", 1)[-1] or directory.count("/") > 1:
                continue  # an export that did not finish, or something deeper than <run name>/<model>
            raw = self._call("reading", self._client().get_object, Bucket=self.bucket, Key=self._key(key))
            raw = self._call("reading", raw["Body"].read)
            try:
                info = ExportInfo(**json.loads(raw))
            except (ValueError, TypeError):
                continue
            inside = f"{directory}/" if directory else ""
            if not all(f"{inside}{name}" in objects for name in info.files):
                continue
            uri = f"{self.uri}/{directory}" if directory else self.uri
            found.append((ExportInfo(**{**asdict(info), "uri": uri}), modified))
        found.sort(key=lambda pair: (pair[0].final, pair[0].step, pair[1]), reverse=True)
        return [info for info, _ in found]

    async def latest_model(self) -> ExportInfo | None:
        models = await asyncio.to_thread(self.models)
        return models[0] if models else None

    async def usage(self) -> DataUsage:
        return await asyncio.to_thread(self._usage)

    async def fetch(self, model: ExportInfo, to: Path,
                    progress: Callable[[int, int], None] | None = None) -> list[str]:
        return await asyncio.to_thread(self._fetch, model, to, progress)

    async def delete(self) -> None:
        await asyncio.to_thread(self._delete)

    def _usage(self) -> DataUsage:
        objects = self._objects()
        size = sum(s for s, _ in objects.values())
        checkpoints = sum(1 for key in objects if key.rsplit("/", 1)[-1] == "rtui_checkpoint.json")
        return DataUsage(self.uri, size, len(self.models()) if objects else 0, checkpoints,
                         monthly_cost=size / 2**30 * S3_STANDARD_PER_GIB_MONTH)

    def _fetch(self, model: ExportInfo, to: Path, progress: Callable[[int, int], None] | None) -> list[str]:
        """Download the listed files (resumable as ``copy_model_dir``: a file of the same size is kept).
        The marker's names are checked as a whole first (``safepath``): an S3 key may hold anything."""
        paths = checked_target(to, model.files, source=model.uri)
        _, directory = split_s3(model.uri)
        keys = {name: f"{directory}/{name}" if directory else name for name in paths}
        sizes = {name: int(self._call("reading", self._client().head_object, Bucket=self.bucket,
                                      Key=key)["ContentLength"]) for name, key in keys.items()}
        total, done, copied = sum(sizes.values()), 0, []
        for name, key in keys.items():
            size = sizes[name]
            if not already_there(paths[name], size):
                with partial_file(to, name) as part:
                    self._call("downloading", self._client().download_fileobj, self.bucket, key, part)
                copied.append(name)
            done += size
            if progress is not None:
                progress(done, total)
        return copied

    def _delete(self) -> None:
        """Every object under the run's prefix, 1,000 keys a request (S3 DeleteObjects' limit)."""
        keys = [self._key(k) for k in self._objects()]
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start:start + 1000]]
            answer = self._call("deleting", self._client().delete_objects, Bucket=self.bucket,
                                Delete={"Objects": batch, "Quiet": True})
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise OperationError(f"deleting {self.uri} failed: {first.get('Code')} on {first.get('Key')}",
                                     remedy="allow s3:DeleteObject on it for your credentials, then run the same "
                                            "command again")


def data_store_for(storage_path: str | None, run_id: str, *, local_default: Path | None,
                   profile: str | None = None, own_bucket: bool = False,
                   clients: Clients | None = None) -> DataStore | None:
    """The store of one run: its prefix under ``--storage-path`` when given, else ``local_default``.
    ``own_bucket``: the path is in a bucket the run made (and deletes with its data); ``clients``: the
    session's, whose S3 client an s3:// store uses (None: a client of its own)."""
    if storage_path:
        uri = run_storage_uri(storage_path, run_id)
        if uri.startswith("s3://"):
            return S3Store(uri, profile, bucket_goes_with_data=own_bucket, clients=clients)
        if "://" not in uri:
            return LocalDirStore(Path(uri).expanduser())
        return None  # gs://, abfs://, hdfs://: written by the job, not fetched by rtui yet
    return LocalDirStore(local_default) if local_default is not None else None


def copy_model_dir(source: Path, model: ExportInfo, to: Path,
                   progress: Callable[[int, int], None] | None = None) -> list[str]:
    """Copy the listed files into ``to`` (made if missing); a file already there with the same size
    is kept (a fetch that was interrupted goes on where it stopped). Returns the names copied. The
    marker was written by the job (the repository's code): its names are checked as for S3."""
    paths = checked_target(to, model.files, source=str(source))
    total = sum((source / n).stat().st_size for n in paths)
    done = 0
    copied = []
    for name in paths:
        src = source / name
        size = src.stat().st_size
        if not already_there(paths[name], size):
            with partial_file(to, name, doing="copying") as part, src.open("rb") as fh:
                shutil.copyfileobj(fh, part)
            copied.append(name)
        done += size
        if progress is not None:
            progress(done, total)
    return copied


def local_data_dir(state_root: Path, run_id: str) -> Path:
    return state_root / "data" / run_id


def model_summary(model: ExportInfo | None, summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """``{uri, format, files, bytes, eval_loss_before, eval_loss_after}`` — what `rtui model --json`
    prints and `rtui status --json` carries under ``model``."""
    if model is None:
        return None
    evaluation = model.eval or {}
    before = (evaluation.get("before") or {}).get("loss")
    after = (evaluation.get("after") or {}).get("loss")
    if summary:
        before = summary.get("eval_loss_before", before)
        after = summary.get("eval_loss_after", after)
    return {"uri": model.uri, "format": model.format, "files": list(model.files), "bytes": model.bytes,
            "step": model.step, "eval_loss_before": before, "eval_loss_after": after,
            "eval_tokens": (evaluation.get("after") or evaluation.get("before") or {}).get("tokens")}


def marker_of(directory: str) -> ExportInfo | None:
    return read_marker(directory)


# -- preflight: can the run write where its data goes? -------------------------------------------

STORAGE_CHECK = "storage.writable"
STORAGE_TITLE = "Storage path is writable"


def check_storage_writable(uri: str, *, profile: str | None = None, run_id: str = "check",
                           clients: Clients | None = None) -> CheckResult:
    """Write (then delete) one small object or file where the run's checkpoints and model will go.

    S3 answers a write its principal may not make with 403 AccessDenied (and a missing bucket with
    404 NoSuchBucket); the result names the principal (STS GetCallerIdentity) and the missing
    permission. A local directory is checked with the user it will be written as."""
    if uri.startswith("s3://"):
        return _check_s3(uri, profile=profile, run_id=run_id, clients=clients)
    if "://" in uri:  # gs://, abfs://, hdfs://: the job writes there with the cluster's own credentials
        return CheckResult(id=STORAGE_CHECK, title=STORAGE_TITLE, status=CheckStatus.INFO,
                           detail=f"--storage-path {uri}: not checked (rtui checks s3:// and directories)")
    return _check_dir(Path(uri))


def _check_dir(path: Path) -> CheckResult:
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    user = getpass.getuser()
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return CheckResult(id=STORAGE_CHECK, title=STORAGE_TITLE, status=CheckStatus.FAIL,
                           detail=f"--storage-path {path}: user {user} may not write to {existing} "
                                  "(missing write permission)",
                           remedy="pick a directory you can write, or grant write permission on it")
    return CheckResult(id=STORAGE_CHECK, title=STORAGE_TITLE, status=CheckStatus.OK, detail=str(path))


def _check_s3(uri: str, *, profile: str | None, run_id: str, clients: Clients | None) -> CheckResult:
    # lazy: boto3 (~400 ms) only for s3:// storage; a local run never loads it
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split_s3(uri)
    key = f"{prefix}/.rtui-write-check-{run_id}" if prefix else f".rtui-write-check-{run_id}"
    resource = f"arn:aws:s3:::{bucket}/{key}"
    principal = "the AWS credentials in use"
    try:
        # STS's regional endpoint needs a region; any will do for a bucket check
        principal = str(aws_client("sts", profile, clients).get_caller_identity()["Arn"])
        s3 = aws_client("s3", profile, clients)
        s3.put_object(Bucket=bucket, Key=key, Body=b"rtui write check\n")
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("AccessDenied", "AllAccessDisabled", "403"):
            detail = f"{principal} may not write to {uri}: missing permission s3:PutObject on {resource}"
        elif code == "NoSuchBucket":
            detail = f"bucket {bucket} does not exist (or is not visible to {principal})"
        else:
            detail = f"writing to {uri} as {principal} failed: {code or exc}"
        return CheckResult(id=STORAGE_CHECK, title=STORAGE_TITLE, status=CheckStatus.FAIL, detail=detail,
                           remedy=f"allow s3:PutObject, s3:GetObject, s3:ListBucket and s3:DeleteObject on "
                                  f"{bucket}/{prefix + '/' if prefix else ''}* for {principal}, or pick "
                                  "another --storage-path")
    except BotoCoreError as exc:
        return CheckResult(id=STORAGE_CHECK, title=STORAGE_TITLE, status=CheckStatus.FAIL,
                           detail=f"cannot reach S3 to check {uri}: {exc}",
                           remedy="check your AWS credentials and network (or AWS_ENDPOINT_URL)")
    try:
        s3.delete_object(Bucket=bucket, Key=key)
    except ClientError:
        return CheckResult(id=STORAGE_CHECK, title=STORAGE_TITLE, status=CheckStatus.WARN,
                           detail=f"{principal} may write to {uri} but not delete (s3:DeleteObject on {resource}): "
                                  f"the probe object {key} stays, and old checkpoints cannot be pruned",
                           remedy=f"allow s3:DeleteObject on {bucket}/{prefix}/* for {principal}")
    return CheckResult(id=STORAGE_CHECK, title=STORAGE_TITLE, status=CheckStatus.OK, detail=f"{uri} as {principal}")
