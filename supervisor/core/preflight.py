"""Mistakes caught before a launch: each would cost a whole vLLM start-up to learn (seconds on the
CPU build, minutes on a GPU), so the guard refuses them first, with exit 78 and what was meant.

Pure: the shell (:mod:`supervisor.facts.preflight`) says whether a path exists and which options the
installed vLLM has; these functions decide. Each answers ``None`` (or ``[]``) when all is well and
never refuses what vLLM would accept: a real option in any spelling vLLM takes, a valid Hugging Face
repo id, a remote URI.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from supervisor.core import vllm
from supervisor.core.vllm_options import Options, explain, unknown_options

#: huggingface_hub's ``validate_repo_id``, which vLLM reaches when a model is not a local path: one
#: optional ``namespace/``, names of word characters, ``-``, ``_`` and ``.`` (Unicode word characters
#: are kept: older huggingface_hub allowed them, and a valid id must never be refused), no name
#: starting or ending with ``-`` or ``.``, at most 96 characters each, no ``--`` or ``..``, no ``.git`` end.
_REPO_ID = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b")


def is_hub_id(name: str) -> bool:
    """Whether vLLM (through huggingface_hub) would take ``name`` as a Hugging Face repo id."""
    return (name.count("/") <= 1 and _REPO_ID.fullmatch(name) is not None
            and "--" not in name and ".." not in name and not name.endswith(".git"))


def is_remote(name: str) -> bool:
    """``s3://bucket/model``, ``gs://...``: vLLM streams these itself (never a local path)."""
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", name) is not None


def missing_local_path(name: str, exists: bool) -> str | None:
    """``name`` is meant as a local path (it cannot be a Hub id) and nothing is there: in words.

    vLLM looks for a local file or directory first and otherwise asks the Hub, which answers a
    path-shaped name with "Repo id must be in the form 'repo_name' or 'namespace/repo_name'". A name
    that is a valid Hub id is never refused: it is one, when nothing local has that name.
    """
    if not name or exists or is_remote(name) or is_hub_id(name):
        return None
    return f"{name} does not exist (and it cannot be a Hugging Face repo id, which is 'name' or 'org/name')"


def flag_problems(args: Sequence[str], options: Options, *, where: str = "",
                  guard_options: Mapping[str, str] | None = None) -> list[str]:
    """What vLLM would refuse among ``args`` (its command line, or its ``--config`` file's keys as
    arguments: ``where`` names the file), in words with "did you mean"; ``[]`` when nothing.

    A flag this vLLM removed that the guard drops by itself before the launch (``vllm.REMOVED_FLAGS``)
    is not a problem here; one of the guard's own options (``guard_options``: option -> its
    ``VLLM_GUARD_*`` variable) is named as such, with where it goes.
    """
    guard = guard_options or {}
    out = []
    for u in unknown_options(args, options):
        if vllm.removed_flag(u.name, options.version) is not None:
            continue                           # dropped before the launch, with the reason (session)
        text = explain(u, options)
        if u.name in guard:
            text += (f"; {u.name} is a vllm-guard option: set {guard[u.name]}, or give it to "
                     f"`vllm-guard start` before `--`")
        out.append(text + (f" (in {where})" if where else ""))
    return out
