"""The Hugging Face model revision a cluster run loads, settled at plan time.

``--model-revision`` may name a branch or a tag, which move: the plan resolves it (default ``main``)
to the commit it points at now, through the Hub API (``GET {HF_ENDPOINT}/api/models/{id}/revision/{rev}``
answers the commit as ``sha``: the request huggingface_hub's ``HfApi.model_info`` makes, done here
without that library, which the CLI does not carry), and the job loads exactly that commit. A full
commit sha is used as it is: it cannot move. A local model directory has no revision.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from backend.errors import OperationError, UserError

DEADLINE_S = 10.0
DEFAULT_ENDPOINT = "https://huggingface.co"
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Revision:
    model_id: str
    asked: str  # what the user named: a branch, a tag, a commit ("main" when nothing was named)
    sha: str  # the commit the job loads


def resolve_revision(model_id: str, revision: str = "", *, token: str | None = None,
                     timeout_s: float = DEADLINE_S) -> Revision:
    """The commit ``revision`` (default main) of the hub model ``model_id`` points at now.

    Raises UserError when the Hub says the model or revision is not there (or not visible without a
    token), OperationError when the Hub does not answer.
    """
    asked = revision or "main"
    if _COMMIT.fullmatch(asked):
        return Revision(model_id, asked, asked)
    # The standard variable (a mirror, or a test's Hub), read when asked.
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    pin = "pass --model-revision COMMIT (40 hex digits) to use a commit without asking the Hub"
    url = f"{endpoint}/api/models/{model_id}/revision/{urllib.parse.quote(asked, safe='')}"
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
            raise UserError(f"the model {model_id} has no revision {asked!r} on {endpoint}",
                            remedy="name a branch, tag or commit it has with --model-revision") from None
        if code in ("RepoNotFound", "GatedRepo") or exc.code in (401, 404):
            who = "with the token of --hf-token" if token else "without a token"
            raise UserError(f"the model {model_id} is not on {endpoint} or not visible {who}",
                            remedy="check --model-id; a private model needs --hf-token env:HF_TOKEN (or a file)",
                            ) from None
        raise OperationError(f"the Hugging Face Hub ({endpoint}) answered HTTP {exc.code} for {model_id}@{asked}",
                             remedy=f"try again later, or {pin}") from None
    except (OSError, ValueError) as exc:  # no answer (refused, timed out, DNS), or not JSON
        reason = getattr(exc, "reason", None) or exc
        raise OperationError(f"cannot ask {endpoint} for the revision of {model_id}: {str(reason)[:80]}",
                             remedy=f"check this machine's network (HF_ENDPOINT names a mirror), or {pin}") from None
    sha = info.get("sha") if isinstance(info, dict) else None
    if not isinstance(sha, str) or not _COMMIT.fullmatch(sha):
        raise OperationError(f"{endpoint} gave no commit for {model_id}@{asked}", remedy=pin)
    return Revision(model_id, asked, sha)
