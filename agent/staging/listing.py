"""What `agent models` and models.list show of a store (docs/protocol.md §19, A model): each
revision held, whole or partly staged, checked against what was staged."""

from __future__ import annotations

from typing import Any

from agent.staging.partial import PartialTransfer
from agent.staging.store import ModelStore, files_under
from shared.staging.manifest import DEFAULT_CHUNK_SIZE
from shared.staging.shapes import MISMATCH, PARTIAL, PRESENT


def held_models(store: ModelStore, verify: bool = False) -> list[dict[str, Any]]:
    """Every model held, whole or partial, as §19's model maps."""
    listed = []
    for repo in store.repos():
        refs = store.refs(repo)
        held, partial = store.revisions(repo)
        for revision in held:
            listed.append(_held(store, repo, revision, refs, verify))
        for revision in partial:
            if revision not in held:
                listed.append(_partial(store, repo, revision, refs))
    return listed


def _held(
    store: ModelStore, repo: str, revision: str, refs: dict[str, str], verify: bool
) -> dict[str, Any]:
    named = [ref for ref, rev in refs.items() if rev == revision]
    record = store.recorded(repo, revision)
    digest, problem = None, None
    files = files_under(store.snapshot(repo, revision))
    size = sum((store.snapshot(repo, revision) / f).stat().st_size for f in files)
    if record is not None or verify:
        chunk_size = record.manifest.chunk_size if record is not None else None
        try:
            manifest, problem = store.snapshot_manifest(
                repo, revision, chunk_size or DEFAULT_CHUNK_SIZE, verify
            )
        except OSError as exc:
            manifest, problem = None, f"cannot read it: {exc.strerror or exc}"
        if record is not None:
            digest = record.manifest.digest
            size = record.manifest.total
        elif manifest is not None:
            digest = manifest.digest
    return {
        "model": repo,
        "revision": revision,
        "refs": named,
        "state": MISMATCH if problem else PRESENT,
        "digest": digest,
        "size": size,
        "bytes": 0 if problem else size,
        "files": len(files),
        "error": problem,
    }


def _partial(store: ModelStore, repo: str, revision: str, refs: dict[str, str]) -> dict[str, Any]:
    folder = store.partial_dir(repo, revision)
    manifest = PartialTransfer.saved_manifest(folder)
    held = PartialTransfer.verified_bytes(folder, manifest) if manifest else 0
    return {
        "model": repo,
        "revision": revision,
        "refs": [ref for ref, rev in refs.items() if rev == revision],
        "state": PARTIAL,
        "digest": manifest.digest if manifest else None,
        "size": manifest.total if manifest else 0,
        "bytes": held,
        "files": len(manifest.files) if manifest else 0,
        "error": None if manifest else "its manifest is unreadable: it is fetched again",
    }
