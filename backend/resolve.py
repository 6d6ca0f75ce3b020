"""How a run's config is resolved from every source, and where each value came from.

Sources, highest precedence first: CLI flag > ``RTUI_*`` environment variable > ``rtui.toml``
(``--config FILE``, else the current directory, else the XDG config dir) > built-in default.
``resolve_config`` records the source of every field so ``rtui config show`` can explain the
effective configuration; the run's target decides which model the values make (``backend.config``),
and a checkout's file sets its held fields only once confirmed (``backend.trust``).
"""

from __future__ import annotations

import json
import os
import shlex
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SerializeAsAny, ValidationError

from backend import registry
from backend.config import (
    CONFIG_FILENAME,
    ENV_PREFIX,
    SHARED_STORAGE_SCHEMES,
    RunConfig,
    config_model,
    env_name,
    field_info,
    field_owners,
    flag_name,
    held_reason,
    is_free,
    session_fields,
    shown,
)
from backend.errors import UserError
from backend.hub import parse_dataset_uri
from backend.paths import config_dir
from backend.trust import digest, is_trusted, is_users_own


def with_session_settings(config: RunConfig, environ: Mapping[str, str] | None = None) -> RunConfig:
    """``config`` with the session fields (``SESSION``) that the environment sets now."""
    environ = os.environ if environ is None else environ
    raw = {field: environ[env_name(field)] for field in session_fields(type(config)) if environ.get(env_name(field))}
    if not raw:
        return config
    try:
        return type(config).model_validate({**config.model_dump(mode="json"), **raw}, strict=False)
    except ValidationError as exc:
        raise _describe_error(exc, {field: "env" for field in raw}, raw) from None


class ResolvedConfig(BaseModel):
    config: SerializeAsAny[RunConfig]  # its target's model, whole
    sources: dict[str, str]
    config_file: str | None = None
    # The held fields a checkout's file (./rtui.toml, or --config outside the user's config dir) sets
    # and the user has not confirmed in this content (see backend.trust), with the file's values, and
    # the hash a confirmation records.
    unconfirmed: dict[str, Any] = Field(default_factory=dict)
    config_sha256: str | None = None


Untrusted = Literal["refuse", "withhold", "show"]


def _find_config_file(explicit: str | None, cwd: Path) -> Path | None:
    if explicit is not None:
        if not explicit:  # Path("") is the current directory: "is a directory" would puzzle
            raise UserError("--config is empty", remedy="pass --config FILE, or leave it out to use ./rtui.toml")
        path = Path(explicit).expanduser()
        problem = _not_a_config_file(path)
        if problem is not None:
            raise UserError(f"config file {shown(explicit)} {problem}", remedy="pass an existing --config FILE")
        return path
    for candidate in (cwd / CONFIG_FILENAME, config_dir() / CONFIG_FILENAME):
        problem = _not_a_config_file(candidate)
        if problem is None:
            return candidate
        if not problem.startswith(_MISSING):
            # There but unreadable: skipping it would run on defaults the user did not choose.
            raise UserError(f"{candidate} {problem}", remedy="remove or rename it, or pass --config FILE")
    return None


_MISSING = "does not exist"


def _not_a_config_file(path: Path) -> str | None:
    """Why ``path`` cannot be read as rtui.toml, or None when it is a regular file.

    Checked before opening: opening a FIFO for reading blocks until a writer appears."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return _MISSING
    except NotADirectoryError:
        return f"{_MISSING} (a parent is not a directory)"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    if stat.S_ISFIFO(mode):
        return "is a FIFO (named pipe), not a regular file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a regular file"
    return "is a device, not a regular file"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None


def _load_toml(path: Path, content: bytes) -> dict[str, Any]:
    # lazy: tomllib only when there is a rtui.toml to read
    import tomllib

    try:
        # utf-8-sig: Windows editors save "UTF-8" with a byte-order mark, which tomllib rejects
        # as an "invalid statement" at line 1.
        data = tomllib.loads(content.decode("utf-8-sig"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({exc})", remedy="fix the file") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})",
                        remedy="save the file as UTF-8 (TOML requires it)") from None
    unknown = sorted(set(data) - set(field_owners()))
    if unknown:
        raise UserError(
            f"{path}: unknown config key {shown(unknown[0])}",
            remedy="see `rtui config show` for the accepted keys",
        )
    return data


def _describe_error(exc: ValidationError, sources: Mapping[str, str], raw: Mapping[str, Any]) -> UserError:
    err = exc.errors()[0]
    field = str(err["loc"][0]) if err["loc"] else "config"
    where = sources.get(field, "default")
    name = flag_name(field) if where == "flag" else env_name(field) if where == "env" else field
    value = raw.get(field, err.get("input"))
    msg = err["msg"].removeprefix("Value error, ")
    if field in field_owners():
        annotation = field_info(field).annotation
        if "Literal" in str(annotation):
            msg = f"expected one of {', '.join(getattr(annotation, '__args__', ()))}"
    return UserError(f"invalid {name}={shown(value)} (from {where}): {msg}")


def resolve_config(
    flags: Mapping[str, Any] | None = None,
    *,
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    untrusted: Untrusted = "refuse",
) -> ResolvedConfig:
    """Merge every source into one validated RunConfig with per-field provenance.

    ``untrusted`` says what becomes of the held fields of a checkout's file (./rtui.toml, or
    ``--config FILE`` outside the user's config dir) the user has not confirmed (backend.trust):
    ``refuse`` (a UserError naming them and how to confirm), ``withhold`` (left out, listed in
    ``unconfirmed`` for the wizard to ask) or ``show`` (kept and marked, for ``config show`` and
    ``config trust``).
    """
    try:
        return _resolve(flags, config_file, environ, cwd, untrusted, hold_whole_file=False)
    except UserError:
        if untrusted != "withhold":
            raise
        # The file's free knobs may fit only its held fields (require_transport = "efa" needs its
        # target = "kube"): until the user confirms, the whole file waits, and the yes takes it all.
        return _resolve(flags, config_file, environ, cwd, untrusted, hold_whole_file=True)


def _resolve(flags: Mapping[str, Any] | None, config_file: str | None, environ: Mapping[str, str] | None,
             cwd: Path | None, untrusted: Untrusted, *, hold_whole_file: bool) -> ResolvedConfig:
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    raw: dict[str, Any] = {}
    sources: dict[str, str] = {}

    path = _find_config_file(config_file, cwd)
    sha256 = None
    if path is not None:
        content = _read(path)
        sha256 = digest(content)
        for key, value in _load_toml(path, content).items():
            raw[key] = value
            sources[key] = f"file:{path}"
    known = field_owners()
    for field in known:
        value = environ.get(env_name(field))
        if value is not None:
            raw[field] = value
            sources[field] = "env"
    unknown_env = sorted(
        k for k in environ if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX) :].lower() not in known
    )
    unknown_env = [k for k in unknown_env if k not in _NON_CONFIG_ENV]
    if unknown_env:
        raise UserError(f"unknown environment variable {shown(unknown_env[0])}", remedy="unset it or fix its name")
    for field, value in (flags or {}).items():
        if value is not None:
            raw[field] = value
            sources[field] = "flag"
    unconfirmed = _unconfirmed(path, sha256, raw, sources, hold_whole_file)
    if unconfirmed and untrusted == "refuse":
        raise UserError(f"{path} sets {', '.join(unconfirmed)}, which you have not confirmed",
                        remedy=f"review them with `{trust_command(config_file, 'show')}`, then run "
                               f"`{trust_command(config_file)}` (or pass them as flags)")
    for field in unconfirmed:
        if untrusted == "withhold":
            del raw[field]
            sources[field] = "default"
        else:
            sources[field] += (f" (held, not confirmed: {held_reason(field)}; review, then "
                               f"`{trust_command(config_file)}`)")
    model = _model_of(raw, sources)
    for field in [f for f in raw if f not in model.model_fields or f in model.refused_fields]:
        _not_this_targets(field, raw, sources, known, model.refused_fields.get(field))
    for field in model.model_fields:
        sources.setdefault(field, "default")
        # Empty strings from env/flags mean "unset" for optional fields.
        if raw.get(field) == "" and model.model_fields[field].default is None:
            raw[field] = None
    try:
        config = model.model_validate(raw, strict=False)
    except ValidationError as exc:
        raise _describe_error(exc, sources, raw) from None
    if config.data_is_hub():
        parse_dataset_uri(config.effective_data())  # its form, said now (an offline target refuses it at plan)
    elif config.data_is_file() and not config.data.startswith("s3://"):
        data_path = (cwd / config.data).resolve()
        try:
            found = data_path.exists()
        except OSError:  # a name too long for the file system, say: it cannot name data either
            found = False
        if not found:
            raise UserError(f"--data {shown(config.data)}: no such file or directory",
                            remedy="give a JSONL/Parquet file or folder, an s3:// URI, `random` or `cycle`")
        config = config.model_copy(update={"data": str(data_path)})
    config = config.target_traits().check(config, cwd)
    if config.tokens_per_step:
        # lazy: the step planner only for --tokens-per-step; not on the first frame
        from training.stepplan import StepPlanError, plan_step

        try:
            plan_step(tokens_per_step=config.tokens_per_step, seq_len=config.effective_seq_len(),
                      world=config.effective_workers(), micro_batch=config.batch_size or None)
        except StepPlanError as exc:
            raise UserError(str(exc)) from None
    config = _check_training(config, cwd)
    return ResolvedConfig(config=config, sources=sources, config_file=str(path) if path else None,
                          unconfirmed=unconfirmed, config_sha256=sha256)


def _model_of(raw: Mapping[str, Any], sources: Mapping[str, str]) -> type[RunConfig]:
    """The config model of the target ``raw`` names (an unknown name is refused as the field's error)."""
    target = raw.get("target", registry.DEFAULT)
    if not isinstance(target, str) or not registry.known(target):
        try:
            RunConfig.model_validate({"target": target}, strict=False)
        except ValidationError as exc:
            raise _describe_error(exc, sources, raw) from None
    return config_model(str(target))


def _not_this_targets(field: str, raw: dict[str, Any], sources: dict[str, str],
                      owners: Mapping[str, tuple[str, ...]], refused: tuple[str, str] | None = None) -> None:
    """A setting of other targets than the run's: a flag is refused (the user asked for it now, on a
    target that would ignore it); a file's or a variable's is left out (one rtui.toml or shell may serve
    several targets). ``refused``: the run's target's own words for a field it inherits and does not take."""
    target, source = raw.get("target", registry.DEFAULT), sources[field]
    whose = " and ".join(owners[field]) + (" targets" if len(owners[field]) > 1 else " target")
    if source == "flag":
        flag = flag_name(field)
        if refused is not None:
            raise UserError(refused[0], remedy=refused[1])
        raise UserError(f"{flag} is a setting of the {whose}; the {target} target has none",
                        remedy=f"leave {flag} out here, or use --target {owners[field][0]}")
    del raw[field]
    sources[field] += f" (not used by the {target} target)"


def trust_command(config_file: str | None, action: Literal["trust", "show"] = "trust") -> str:
    """The command that confirms (or shows) the file read: ./rtui.toml in this directory, or the one named."""
    command = f"rtui config {action}"
    return f"{command} --config {shlex.quote(config_file)}" if config_file else command


def _unconfirmed(path: Path | None, sha256: str | None, raw: Mapping[str, Any], sources: dict[str, str],
                 hold_whole_file: bool = False) -> dict[str, Any]:
    """{held field: value} a checkout's file decides and the user has not confirmed in this content.

    Every file is held (./rtui.toml and ``--config FILE`` alike) except one inside the user's own
    config dir; a held field a flag or variable sets is not read from the file. A confirmed file's
    held fields say so. ``hold_whole_file``: its free fields wait too, when held fields are in it."""
    if path is None or sha256 is None or is_users_own(path, config_dir()):
        return {}
    from_file = [f for f in field_owners() if sources.get(f, "").startswith("file:")]
    held = [f for f in from_file if not is_free(f)]
    if held and hold_whole_file and not is_trusted(path, sha256):
        held = from_file
    if not held:
        return {}
    if is_trusted(path, sha256):
        for field in held:
            sources[field] += " (confirmed)"
        return {}
    return {f: raw[f] for f in held}


def _check_training(config: RunConfig, cwd: Path) -> RunConfig:
    """What the job would refuse (or silently get wrong) on the cluster, said before anything starts;
    a local model directory comes back absolute (the job does not run in this directory)."""
    if config.shard_size and config.shard == "full":
        raise UserError(f"--shard-size={config.shard_size} applies to --shard hybrid only",
                        remedy="add --shard hybrid, or drop --shard-size")
    workers = config.effective_workers()
    if config.shard == "hybrid" and workers % config.effective_shard_size():
        raise UserError(f"--shard hybrid: shard groups of {config.effective_shard_size()} GPUs do not divide the "
                        f"{workers} workers", remedy="set --shard-size to a divisor of the workers (the GPUs per node)")
    if not config.target_traits().shared_disk and (config.checkpoint_every or config.resume_from):
        storage = config.storage_path or ""
        if not storage.startswith(SHARED_STORAGE_SCHEMES) and not config.target_traits().gives_storage(config):
            what = "--checkpoint-every" if config.checkpoint_every else "--resume-from"
            where = f"--storage-path {shown(storage)} is" if storage else "without --storage-path, checkpoints go to"
            raise UserError(f"{what} on {config.target}: {where} each node's own disk, so no node holds a whole "
                            "checkpoint and a resume finds none",
                            remedy="pass --storage-path s3://BUCKET/PREFIX (shared storage every node can write)")
    _check_model_family(config, cwd)
    if config.data_is_file() and not config.data_is_hub():  # a Hub dataset is pinned and named by the plan
        from backend.datacheck import check_data  # lazy: pyarrow/transformers only for data files

        check_data(config.data, text_field=config.text_field, tokenizer=config.tokenizer or config.model_id,
                   seq_len=config.effective_seq_len(), cwd=cwd)
    return config


def _check_model_family(config: RunConfig, cwd: Path) -> None:
    """A local model directory the job would refuse (no decoder layer list to shard), said at plan time.
    A hub id is checked by the job, which reads its config.json first (``training.step.load_pretrained``)."""
    from training.families import refusal  # lazy: stdlib only, but training/ stays out of the config's import

    path = cwd / config.model_id / "config.json" if config.model_id else None
    try:
        raw = json.loads(path.read_text()) if path is not None and path.is_file() else None
    except (OSError, ValueError):
        return  # unreadable here: the job says what is wrong with it
    why = refusal(raw) if isinstance(raw, dict) else None
    if why:
        raise UserError(f"--model-id {shown(config.model_id)}: {why}",
                        remedy="pick a decoder-only causal LM such as Qwen2/3, Llama, Mistral or Gemma")


# RTUI_* variables that are not config fields (so they are not reported as typos).
_NON_CONFIG_ENV = frozenset({"RTUI_STATE_DIR", "RTUI_CONFIG_DIR", "RTUI_CACHE_DIR", "RTUI_LOG_LEVEL",
                             "RTUI_CHECKIP_URL"})
