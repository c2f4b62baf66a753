"""What the coordinator makes of the agents' staging replies (docs/protocol.md §19): the models
table (model × host: present, partial with its share, missing, mismatch), the copy a benchmark's
`--model ORG/NAME[@REV]` names on a host, and the one line that refuses a host whose copy
differs from the others'. Pure: on replies already checked by shared.wire."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

PRESENT, PARTIAL, MISMATCH, MISSING = "present", "partial", "mismatch", "missing"
UNKNOWN = "unknown"
"""A host that could not be asked: its state is not known."""
MB = 1_000_000
STATES_SHOWN = {
    "resolving": "resolving",
    "downloading": "downloading",
    "hashing": "hashing",
    "fetching": "fetching",
    "ready": "ready",
    "failed": "failed",
    "cancelled": "cancelled",
}


CHUNKS_AT_LEAST = 32
"""A model is cut into at least this many chunks where the chunk size allows: the seed's
follower ends one chunk after the seed, and a resumed transfer re-sends at most one per file."""
SMALLEST_CHUNK = 256 * 1024
LARGEST_CHUNK = 2 * 1024 * 1024
"""The protocol's largest chunk (shared.staging.manifest.MAX_CHUNK_SIZE, §19)."""


def chunk_size_for(total: int) -> int:
    """The chunk size for a model of `total` bytes: the largest power of two that cuts it into
    CHUNKS_AT_LEAST chunks, within SMALLEST_CHUNK and LARGEST_CHUNK (each chunk is a request
    and its reply: smaller ones cost a round trip each)."""
    size = SMALLEST_CHUNK
    while size * 2 <= min(LARGEST_CHUNK, total // CHUNKS_AT_LEAST):
        size *= 2
    return size


def byte_text(count: int | None) -> str:
    """Bytes in MB (10**6) or GB (10**9), as the rest of the fleet's tables count them."""
    if count is None:
        return "?"
    if count >= 10 * 1000 * MB:
        return f"{count / 1e9:.1f} GB"
    if count >= 1000 * MB:
        return f"{count / 1e9:.2f} GB"
    return f"{count / MB:.1f} MB"


def rate_text(rate: float | None) -> str:
    return "rate unknown" if rate is None else f"{rate / MB:.1f} MB/s"


def state_text(task: Mapping[str, Any]) -> str:
    """A task's state, with its share done while it hashes or downloads."""
    state = STATES_SHOWN.get(task["state"], task["state"])
    total = task.get("total")
    if task["state"] in ("hashing", "downloading", "fetching") and total:
        return f"{state} {100 * task['bytes'] / total:.0f} %"
    return state


def copy_label(model: Mapping[str, Any]) -> str:
    """`ORG/NAME@REV7` (the first 7 digits of the commit, as the benchmark's labels show it)."""
    return f"{model['model']}@{model['revision'][:7]}"


def host_state(model: Mapping[str, Any]) -> str:
    """`present`, `partial (N %)`, or `mismatch`: one model as a host's models.list names it."""
    if model["state"] == PARTIAL:
        share = 100 * model["bytes"] / model["size"] if model["size"] else 0.0
        return f"{PARTIAL} ({share:.0f} %)"
    return str(model["state"])


def models_matrix(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every copy any host holds (by model and revision), each host's state of it: what the
    models table shows, in order of the model's name. `rows`: {`host`, `models` (models.list's),
    `error` (why it could not be asked, else None)}."""
    copies: dict[tuple[str, str], dict[str, str]] = {}
    for row in rows:
        for model in row["models"] or []:
            copies.setdefault((model["model"], model["revision"]), {})[row["host"]] = host_state(
                model
            )
    return [
        {
            "model": f"{name}@{revision[:7]}",
            "name": name,
            "revision": revision,
            "hosts": {
                row["host"]: held.get(row["host"], UNKNOWN if row["error"] else MISSING)
                for row in rows
            },
        }
        for (name, revision), held in sorted(copies.items())
    ]


def named_copy(
    models: Sequence[Mapping[str, Any]], repo: str, revision: str | None
) -> Mapping[str, Any] | None:
    """The copy `ORG/NAME[@REVISION]` names among a host's models: the revision given, by the
    commit (or a prefix of 7 or more digits) or a ref; without one, the copy `main` names (or
    the only copy there is)."""
    mine = [model for model in models if model["model"] == repo]
    if revision is None:
        named = [model for model in mine if "main" in model["refs"]]
        return named[0] if named else (mine[0] if len(mine) == 1 else None)
    for model in mine:
        if revision in model["refs"] or (
            len(revision) >= 7 and model["revision"].startswith(revision.lower())
        ):
            return model
    return None


def differing_copy(model: str, held: Mapping[str, Mapping[str, Any] | None]) -> str | None:
    """The line that refuses a run on these hosts, else None: a host whose copy of `model`
    differs from the manifest it was staged from (naming the file), or whose digest is not the
    one most hosts hold (the others named). `held`: each host's copy (named_copy), None where it
    holds none (a host that fetches the model itself is no difference)."""
    for host, copy in held.items():
        if copy is not None and copy["state"] == MISMATCH:
            why = copy["error"] or "a file changed"
            return f"{host}: its copy of {model} is not what was staged: {why}"
    digests = {host: copy["digest"] for host, copy in held.items() if copy and copy["digest"]}
    if len(set(digests.values())) < 2:
        return None
    common, _ = Counter(digests.values()).most_common(1)[0]
    odd = next(host for host, digest in digests.items() if digest != common)
    same = next(host for host, digest in digests.items() if digest == common)
    theirs, ours = held[odd], held[same]
    assert theirs is not None and ours is not None
    return (
        f"{odd}: its copy of {model} ({theirs['revision'][:12]}, digest "
        f"{theirs['digest'][:12]}) is not {same}'s ({ours['revision'][:12]}, digest "
        f"{ours['digest'][:12]}): stage it again with --restage"
    )
