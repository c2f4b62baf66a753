"""Hugging Face model ids (`--model ORG/NAME[@REVISION]`) resolved on this machine as mlx-lm
resolves them (mlx_lm/utils.py `_download`): a name that is an existing directory is that
directory; anything else is a repository, fetched with huggingface_hub's `snapshot_download` of
the files mlx-lm loads into the Hugging Face cache (`HF_HOME`, `HF_HUB_CACHE`), or read from
that cache alone when `HF_HUB_OFFLINE=1`. The snapshot's folder is named after the commit it
holds: the revision a label shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shared.benchmark.matrix import MODEL_FILE_PATTERNS, ModelId, hf_model_id


class ModelNotFound(Exception):
    """A model id that cannot be resolved; the message (one line) names it and what to do."""


@dataclass(frozen=True)
class ModelLocation:
    """Where a --model is on this machine; `revision` is the commit of a Hugging Face id."""

    path: Path
    revision: str | None = None


def names_a_repo(name: str) -> bool:
    """ORG/NAME[@REVISION] that is nothing on this disk: mlx-lm downloads what does not exist."""
    if hf_model_id(name) is None:
        return False
    try:
        return not Path(name).expanduser().exists()
    except OSError:  # a name too long for a path: a path, whose check will say why
        return False


def locate(name: str, download: bool = True) -> ModelLocation:
    """A directory as it is; a Hugging Face id resolved to its snapshot in the cache (fetched
    first when `download` and the network allow; from the cache alone otherwise). Raises
    ModelNotFound naming the id."""
    model_id = hf_model_id(name)
    if model_id is None or not names_a_repo(name):
        return ModelLocation(Path(name).expanduser())
    return resolve(model_id, download)


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it: nothing may be downloaded."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def staged(model_id: ModelId, cache_dir: Path | None = None) -> ModelLocation | None:
    """The copy `coordinator stage` placed for `model_id` in the cache (docs/staging.md): the
    revision its ref names (`main` without one), with the record it was staged from; None
    when there is none. It is used as staged, without asking the Hub: its bytes were verified
    as it was placed, and its id may name no repository there (`--as lab/NAME`)."""
    from agent.staging.store import ModelStore
    from shared.staging.manifest import COMMIT

    store = ModelStore(cache_dir)
    asked = model_id.revision or "main"
    revision = asked if COMMIT.fullmatch(asked) else store.refs(model_id.repo).get(asked)
    if revision is None or not store.record_path(model_id.repo, revision).is_file():
        return None
    snapshot = store.snapshot(model_id.repo, revision)
    return ModelLocation(snapshot, revision) if snapshot.is_dir() else None


def resolve(
    model_id: ModelId, download: bool = True, cache_dir: Path | None = None
) -> ModelLocation:
    """`model_id`'s snapshot in the Hugging Face cache (or `cache_dir`, a store of the same
    layout: agent.staging.store): a staged copy as it is, else fetched first when `download`;
    ModelNotFound naming it."""
    held = staged(model_id, cache_dir)
    if held is not None:
        return held
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    shown = model_id.repo + (f"@{model_id.revision}" if model_id.revision else "")
    fetch = f"`hf download {model_id.repo}" + (
        f" --revision {model_id.revision}`" if model_id.revision else "`"
    )
    try:
        folder = snapshot_download(
            model_id.repo,
            revision=model_id.revision,
            allow_patterns=MODEL_FILE_PATTERNS,
            local_files_only=not download,
            cache_dir=cache_dir,
        )
    except GatedRepoError:
        raise ModelNotFound(
            f"model {shown} is gated: accept its terms on huggingface.co, then `hf auth login`"
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFound(
            f"model {shown}: {model_id.repo} has no revision {model_id.revision!r}"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(
            f"model {shown}: no such Hugging Face repository (a private one needs `hf auth login`)"
        ) from None
    except HFValidationError as exc:
        raise ModelNotFound(f"model {shown} is not a Hugging Face id: {exc}") from None
    except LocalEntryNotFoundError:
        where = cache_dir or constants.HF_HUB_CACHE
        if constants.HF_HUB_OFFLINE:
            raise ModelNotFound(
                f"model {shown} is not in the Hugging Face cache {where} and HF_HUB_OFFLINE=1 "
                f"forbids downloading it: run {fetch} where the network allows"
            ) from None
        if not download:
            raise ModelNotFound(
                f"model {shown} is not in the Hugging Face cache {where}: run {fetch}"
            ) from None
        raise ModelNotFound(
            f"model {shown} cannot be downloaded (no network?) and is not in the Hugging Face "
            f"cache {where}: check the connection, or run {fetch} where one works"
        ) from None
    except OSError as exc:  # a cache folder we may not write, a full disk
        raise ModelNotFound(f"model {shown}: {exc}") from None
    path = Path(folder)
    return ModelLocation(path, path.name)
