"""The Hugging Face model revision a cluster run loads, settled at plan time.

``--model-revision`` may name a branch or a tag, which move: the plan resolves it (default ``main``)
to the commit it points at now, through the Hub API (``GET {HF_ENDPOINT}/api/models/{id}/revision/{rev}``
answers the commit as ``sha``: the request huggingface_hub's ``HfApi.model_info`` makes, done here
without that library, which the CLI does not carry), and the job loads exactly that commit. A full
commit sha is used as it is: it cannot move. A local model directory has no revision.

Datasets on the Hub are pinned the same way (``GET {HF_ENDPOINT}/api/datasets/{id}/revision/{rev}``,
huggingface_hub's ``HfApi.dataset_info``): ``--data hf://datasets/OWNER/NAME[@REV][/PATH]`` becomes
``hf://datasets/OWNER/NAME@<commit>/PATH``, the form huggingface_hub's ``HfFileSystem`` reads at that
commit (``training.data`` reads it so, as Ray Data's docs advise for Hub datasets). GPU targets train on
``DEFAULT_DATASET`` unless ``--data`` says otherwise.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from backend.errors import OperationError, UserError

DEADLINE_S = 10.0
DEFAULT_ENDPOINT = "https://huggingface.co"
_COMMIT = re.compile(r"[0-9a-f]{40}")


HF_DATASETS = "hf://datasets/"


@dataclass(frozen=True)
class HubDataset:
    repo: str  # OWNER/NAME
    path: str  # the folder (or file) of its data in the repo
    licence: str  # SPDX id, as its card says
    source: str  # where the licence and the fields were checked


# A small chat set in the `messages` format training.sft reads (role/content turns), Apache-2.0 per
# its dataset card (huggingface.co/datasets/HuggingFaceTB/everyday-conversations-llama3.1-2k: License
# apache-2.0, parquet under data/, ~2.2k multi-turn conversations with a `messages` column).
DEFAULT_DATASET = HubDataset("HuggingFaceTB/everyday-conversations-llama3.1-2k", "data", "apache-2.0",
                             "https://huggingface.co/datasets/HuggingFaceTB/everyday-conversations-llama3.1-2k")


def default_dataset_uri(sha: str = "") -> str:
    """The default dataset's ``--data``; at commit ``sha`` when given (then the Hub is not asked)."""
    return f"{HF_DATASETS}{DEFAULT_DATASET.repo}{'@' + sha if sha else ''}/{DEFAULT_DATASET.path}"


@dataclass(frozen=True)
class DatasetRef:
    repo: str
    revision: str  # "" when the URI names none (main)
    path: str

    def uri(self, sha: str) -> str:
        return f"{HF_DATASETS}{self.repo}@{sha}" + (f"/{self.path}" if self.path else "")


def parse_dataset_uri(uri: str) -> DatasetRef | None:
    """``hf://datasets/OWNER/NAME[@REV][/PATH]`` in parts; None for anything else."""
    if not uri.startswith(HF_DATASETS):
        return None
    owner, _, rest = uri[len(HF_DATASETS):].partition("/")
    name_rev, _, path = rest.partition("/")
    name, _, revision = name_rev.partition("@")
    if not owner or not name:
        raise UserError(f"--data {uri}: a Hub dataset is hf://datasets/OWNER/NAME[@REVISION][/PATH]",
                        remedy="name the dataset's owner and name, as on its Hub page")
    return DatasetRef(f"{owner}/{name}", revision, path.strip("/"))


@dataclass(frozen=True)
class Revision:
    model_id: str
    asked: str  # what the user named: a branch, a tag, a commit ("main" when nothing was named)
    sha: str  # the commit the job loads


@dataclass(frozen=True)
class DatasetRevision:
    ref: DatasetRef
    asked: str
    sha: str
    licence: str  # "" when the Hub was not asked (a commit given) and the dataset is not rtui's default

    def describe(self) -> str:
        licence = f"licence {self.licence}" if self.licence else "licence: see its dataset card"
        return f"{self.ref.uri(self.sha)} ({self.asked}), {licence}"


def resolve_dataset(uri: str, *, token: str | None = None, timeout_s: float = DEADLINE_S) -> DatasetRevision:
    """The commit the Hub dataset of ``uri`` points at now, and its licence (as its card says)."""
    ref = parse_dataset_uri(uri)
    assert ref is not None, uri
    asked = ref.revision or "main"
    known = DEFAULT_DATASET.licence if ref.repo == DEFAULT_DATASET.repo else ""
    if _COMMIT.fullmatch(asked):
        return DatasetRevision(ref, asked, asked, known)
    info = _ask_hub("datasets", ref.repo, asked, token=token, timeout_s=timeout_s, flag="--data",
                    pin=f"pass --data {HF_DATASETS}{ref.repo}@COMMIT (40 hex digits) to use a commit without "
                        "asking the Hub, or a data file")
    card = info.get("cardData")
    licence = card.get("license") if isinstance(card, dict) and isinstance(card.get("license"), str) else ""
    if not licence:
        listed = info.get("tags")
        tags = [t for t in (listed if isinstance(listed, list) else [])
                if isinstance(t, str) and t.startswith("license:")]
        licence = tags[0].removeprefix("license:") if tags else known
    return DatasetRevision(ref, asked, str(info["sha"]), licence)


def resolve_revision(model_id: str, revision: str = "", *, token: str | None = None,
                     timeout_s: float = DEADLINE_S) -> Revision:
    """The commit ``revision`` (default main) of the hub model ``model_id`` points at now.

    Raises UserError when the Hub says the model or revision is not there (or not visible without a
    token), OperationError when the Hub does not answer.
    """
    asked = revision or "main"
    if _COMMIT.fullmatch(asked):
        return Revision(model_id, asked, asked)
    info = _ask_hub("models", model_id, asked, token=token, timeout_s=timeout_s, flag="--model-revision",
                    pin="pass --model-revision COMMIT (40 hex digits) to use a commit without asking the Hub")
    return Revision(model_id, asked, str(info["sha"]))


def _ask_hub(kind: str, repo: str, asked: str, *, token: str | None, timeout_s: float, flag: str,
             pin: str) -> dict[str, object]:
    """The Hub's info on ``repo`` (a model or a dataset) at ``asked``, with its commit in ``sha``."""
    what = "model" if kind == "models" else "dataset"
    # The standard variable (a mirror, or a test's Hub), read when asked.
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    model_id = repo
    url = f"{endpoint}/api/{kind}/{repo}/revision/{urllib.parse.quote(asked, safe='')}"
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),  # noqa: S310 - http(s) endpoint
                                    timeout=timeout_s) as response:
            info = json.loads(response.read(1 << 20))
    except urllib.error.HTTPError as exc:
        # The Hub names the failure in X-Error-Code (what huggingface_hub's hf_raise_for_status reads);
        # a model that is missing, private or not readable with this token is the same 401 RepoNotFound.
        code = exc.headers.get("X-Error-Code", "")
        if code == "RevisionNotFound":
            raise UserError(f"the {what} {model_id} has no revision {asked!r} on {endpoint}",
                            remedy=f"name a branch, tag or commit it has with {flag}") from None
        if code in ("RepoNotFound", "GatedRepo") or exc.code in (401, 404):
            who = "with the token of --hf-token" if token else "without a token"
            check = "--model-id" if kind == "models" else "--data"
            raise UserError(f"the {what} {model_id} is not on {endpoint} or not visible {who}",
                            remedy=f"check {check}; a private {what} needs --hf-token env:HF_TOKEN (or a file)",
                            ) from None
        raise OperationError(f"the Hugging Face Hub ({endpoint}) answered HTTP {exc.code} for {model_id}@{asked}",
                             remedy=f"try again later, or {pin}") from None
    except (OSError, ValueError) as exc:  # no answer (refused, timed out, DNS), or not JSON
        reason = getattr(exc, "reason", None) or exc
        raise OperationError(f"cannot ask {endpoint} for the revision of the {what} {model_id}: {str(reason)[:80]}",
                             remedy=f"check this machine's network (HF_ENDPOINT names a mirror), or {pin}") from None
    sha = info.get("sha") if isinstance(info, dict) else None
    if not isinstance(sha, str) or not _COMMIT.fullmatch(sha):
        raise OperationError(f"{endpoint} gave no commit for {model_id}@{asked}", remedy=pin)
    return {str(k): v for k, v in info.items()}


def read_hf_token(config_value: str) -> str:
    """The token from ``env:NAME`` or a file: read when applied, kept nowhere but the Secret."""
    if config_value.startswith("env:"):
        name = config_value[4:]
        value = os.environ.get(name, "").strip()
        if not value:
            raise UserError(f"--hf-token names {name}, which is not set in rtui's environment",
                            remedy=f"export {name}=… first, or drop --hf-token")
        return value
    try:
        value = Path(config_value).expanduser().read_text().strip()
    except OSError as exc:
        raise UserError(f"cannot read the Hugging Face token file {config_value} ({exc.strerror})",
                        remedy="name a readable file, or use --hf-token env:HF_TOKEN") from None
    if not value:
        raise UserError(f"the Hugging Face token file {config_value} is empty", remedy="put the token in it")
    return value
