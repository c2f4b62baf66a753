"""The agent's model store (docs/protocol.md §19, The store): the Hugging Face cache layout, so
`HF_HUB_OFFLINE=1` and mlx-lm resolve what was staged, with the agent's own records beside it.

    models--ORG--NAME/snapshots/REV/...      the files (plain files; a download's symlinks too)
    models--ORG--NAME/refs/REF               REV
    models--ORG--NAME/.mlx-fleet/REV.json    {digest, manifest, stats: {path: [size, mtime_ns]}}
    models--ORG--NAME/.mlx-fleet/partial-REV a transfer under way (agent.staging.partial)

The layout is huggingface_hub's (file_download.py `_cache_commit_hash_for_specific_revision`,
`repo_folder_name`): a `refs/REF` file holding the commit and a `snapshots/COMMIT` folder is
what `snapshot_download(..., local_files_only=True)` looks for.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from shared.staging.manifest import (
    RESERVED_PREFIX,
    FileEntry,
    FileHasher,
    Manifest,
    ManifestError,
    build,
    check_path,
    first_difference,
    manifest_from_wire,
)
from shared.wire import protocol as p

META = RESERVED_PREFIX
MARGIN_BYTES = 256 * 1024 * 1024
MARGIN_SHARE = 0.05
"""A stage needs room for the model plus 256 MiB and 5 % of it (§19): what the disk keeps for
the system, logs and the job's own files, so staging never fills it."""
READ_BLOCK = 1024 * 1024
Progress = Callable[[int], None]
"""Told each block's bytes as a file is hashed."""


class StoreError(Exception):
    """A refusal with its protocol error code (bad-store, no-space, not-held, busy, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def default_root() -> Path:
    """The Hugging Face cache, as huggingface_hub resolves it (HF_HUB_CACHE, HF_HOME)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_folder(repo: str) -> str:
    """huggingface_hub's repo_folder_name for a model: `models--ORG--NAME`."""
    return "models--" + repo.replace("/", "--")


def hash_files(folder: Path, chunk_size: int, progress: Progress | None = None) -> list[FileEntry]:
    """Every file under `folder` (symlinks followed: a download's snapshot is made of them),
    hashed."""
    return [hash_file(folder, path, chunk_size, progress) for path in files_under(folder)]


def files_under(folder: Path) -> list[str]:
    """The files of a model folder, as manifest paths: hidden files and folders (`.git`,
    huggingface_hub's `.cache`, the agent's `.mlx-fleet`) are no part of a model."""
    found = []
    for top, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            if not name.startswith(".") and os.path.isfile(os.path.join(top, name)):
                found.append(Path(top, name).relative_to(folder).as_posix())
    return sorted(found)


def hash_file(
    folder: Path, path: str, chunk_size: int, progress: Progress | None = None
) -> FileEntry:
    hasher = FileHasher(chunk_size)
    with open(folder / path, "rb") as handle:
        while block := handle.read(READ_BLOCK):
            hasher.update(block)
            if progress is not None:
                progress(len(block))
    return hasher.finish(path)


def stat_key(path: Path) -> list[int]:
    info = path.stat()
    return [info.st_size, info.st_mtime_ns]


@dataclass(frozen=True)
class Record:
    """What the agent wrote when it staged or hashed a snapshot: its manifest, and each file's
    size and mtime then, so an unchanged file need not be hashed again."""

    manifest: Manifest
    stats: dict[str, list[int]]


class ModelStore:
    """One store (a folder): where each model's files, refs and records live."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or default_root()).expanduser()

    def entry(self, repo: str) -> Path:
        return self.root / repo_folder(repo)

    def snapshot(self, repo: str, revision: str) -> Path:
        return self.entry(repo) / "snapshots" / revision

    def meta(self, repo: str) -> Path:
        return self.entry(repo) / META

    def record_path(self, repo: str, revision: str) -> Path:
        return self.meta(repo) / f"{revision}.json"

    def partial_dir(self, repo: str, revision: str) -> Path:
        return self.meta(repo) / f"partial-{revision}"

    # -- checks made before any byte moves

    def check_writable(self) -> None:
        """StoreError(bad-store) when the store, or the nearest folder above it that exists, is
        a file, read-only or not ours to write: nothing is created here to find out."""
        path = self.root
        while not path.exists() and path != path.parent:
            if path.is_symlink():  # a dangling link: nothing can be made through it
                raise StoreError(p.BAD_STORE, f"the models directory {path} is a broken link")
            path = path.parent
        if not path.is_dir():
            raise StoreError(p.BAD_STORE, f"the models directory {path} is a file")
        read_only = os.statvfs(path).f_flag & os.ST_RDONLY
        if read_only or not os.access(path, os.W_OK | os.X_OK):
            why = "is on a read-only file system" if read_only else "is not writable"
            raise StoreError(p.BAD_STORE, f"the models directory {path} {why}")

    def check_room(self, repo: str, needed: int, size: int) -> None:
        """StoreError(no-space) unless the store's file system holds `needed` more bytes plus
        the margin for a model of `size`."""
        path = self.root
        while not path.exists():
            path = path.parent
        free = shutil.disk_usage(path).free
        margin = MARGIN_BYTES + int(size * MARGIN_SHARE)
        if free < needed + margin:
            raise StoreError(
                p.NO_SPACE,
                f"no room for {repo} ({gb(needed)} + {gb(margin)} margin): {gb(free)} free on "
                f"{self.root}",
            )

    # -- records

    def recorded(self, repo: str, revision: str) -> Record | None:
        """The record of a snapshot, None without one (or with one that does not parse: it is
        then hashed again)."""
        try:
            raw = json.loads(self.record_path(repo, revision).read_text(encoding="utf-8"))
            manifest = manifest_from_wire(raw["manifest"], raw["digest"])
            stats = {str(k): [int(n) for n in v] for k, v in raw["stats"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        return Record(manifest, stats)

    def write_record(self, manifest: Manifest, folder: Path) -> Record:
        """Record `manifest` as the snapshot's, with its files' stats now (in `folder`: the
        snapshot, or the transfer's folder about to become it)."""
        stats = {entry.path: stat_key(folder / entry.path) for entry in manifest.files}
        record = {"digest": manifest.digest, "manifest": manifest.to_dict(), "stats": stats}
        self.meta(manifest.model).mkdir(parents=True, exist_ok=True)
        path = self.record_path(manifest.model, manifest.revision)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record, separators=(",", ":")), encoding="utf-8")
        os.replace(temporary, path)
        return Record(manifest, stats)

    def unchanged(self, record: Record, repo: str, revision: str) -> bool:
        """Whether the snapshot holds exactly the recorded files, each with its recorded size
        and mtime: what can be known without reading them."""
        folder = self.snapshot(repo, revision)
        try:
            files = files_under(folder)
            return files == sorted(record.stats) and all(
                record.stats[path] == stat_key(folder / path) for path in files
            )
        except OSError:
            return False

    def snapshot_manifest(
        self,
        repo: str,
        revision: str,
        chunk_size: int,
        verify: bool = False,
        progress: Progress | None = None,
    ) -> tuple[Manifest, str | None]:
        """The manifest of the snapshot held now, and the first way it differs from its record
        (None: it matches, or there was no record, which is then written). A file whose size or
        mtime changed since it was recorded, or every one with `verify`, is hashed again; the
        rest are taken from the record. Raises OSError when the snapshot cannot be read."""
        folder = self.snapshot(repo, revision)
        record = self.recorded(repo, revision)
        if record is not None and record.manifest.chunk_size != chunk_size:
            record = None  # another chunk size: every hash differs
        entries = []
        for path in files_under(folder):
            held = record.manifest.by_path.get(path) if record is not None else None
            unchanged = held is not None and record is not None
            unchanged = unchanged and record.stats.get(path) == stat_key(folder / path)
            if unchanged and not verify and held is not None:
                entries.append(held)
                if progress is not None:
                    progress(held.size)
            else:
                entries.append(hash_file(folder, path, chunk_size, progress))
        try:
            manifest = build(repo, revision, chunk_size, entries)
        except ManifestError as exc:
            raise OSError(errno.EINVAL, f"{folder}: {exc}") from None
        if record is None:
            self.write_record(manifest, folder)
            return manifest, None
        problem = first_difference(manifest, record.manifest)
        if problem is None and verify:
            self.write_record(manifest, folder)  # the stats hashed now
        return manifest, problem

    # -- placing and naming

    def place(self, manifest: Manifest, files: Path, ref: str | None) -> Path:
        """Make the verified folder `files` the snapshot of its revision by one rename, after
        its record; then point `refs/REF` at it. The snapshot appears whole or not at all."""
        repo, revision = manifest.model, manifest.revision
        target = self.snapshot(repo, revision)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.write_record(manifest, files)
        if target.exists():  # a copy replaced (restage): moved aside, then removed
            aside = self.meta(repo) / f"replaced-{revision}"
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(target, aside)
            shutil.rmtree(aside, ignore_errors=True)
        os.rename(files, target)
        if ref is not None:
            self.write_ref(repo, ref, revision)
        return target

    def write_ref(self, repo: str, ref: str, revision: str) -> None:
        check_path(ref)  # a branch or tag may hold '/', never a way out
        path = self.entry(repo) / "refs" / ref
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(revision, encoding="utf-8")
        os.replace(temporary, path)

    def refs(self, repo: str) -> dict[str, str]:
        """ref -> revision."""
        folder = self.entry(repo) / "refs"
        found = {}
        for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
            if path.is_file() and not path.name.startswith("."):
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    found[path.relative_to(folder).as_posix()] = path.read_text().strip()
        return found

    def repos(self) -> list[str]:
        """ORG/NAME of every model folder in the store."""
        if not self.root.is_dir():
            return []
        return sorted(
            folder.name.removeprefix("models--").replace("--", "/", 1)
            for folder in self.root.iterdir()
            if folder.name.startswith("models--") and folder.is_dir()
        )

    def revisions(self, repo: str) -> tuple[list[str], list[str]]:
        """(snapshots held, partial transfers) of `repo`, by revision."""
        snapshots = self.entry(repo) / "snapshots"
        held = (
            sorted(d.name for d in snapshots.iterdir() if d.is_dir()) if snapshots.is_dir() else []
        )
        meta = self.meta(repo)
        partial = sorted(
            d.name.removeprefix("partial-")
            for d in (meta.iterdir() if meta.is_dir() else [])
            if d.name.startswith("partial-") and d.is_dir()
        )
        return held, partial

    def remove(self, repo: str, revision: str | None, partial_only: bool) -> list[str]:
        """Remove what is held of `repo` (one revision, or all): the snapshot, its refs and
        record, and its partial transfer; with `partial_only`, the partial transfer alone.
        StoreError(not-held) when there is nothing, (busy) while it is being staged."""
        held, partial = self.revisions(repo)
        revisions = sorted(set(partial if partial_only else held + partial))
        revision = self.refs(repo).get(revision or "", revision)  # ORG/NAME@main
        if revision is not None:
            revisions = [r for r in revisions if r == revision]
        if not revisions:
            what = "no partial transfer" if partial_only else "nothing"
            raise StoreError(p.NOT_HELD, f"{what} of {repo}{at(revision)} in {self.root}")
        with self.lock(repo):
            for rev in revisions:
                shutil.rmtree(self.partial_dir(repo, rev), ignore_errors=True)
                if partial_only:
                    continue
                for ref, pointed in self.refs(repo).items():
                    if pointed == rev:
                        (self.entry(repo) / "refs" / ref).unlink(missing_ok=True)
                self.record_path(repo, rev).unlink(missing_ok=True)
                shutil.rmtree(self.snapshot(repo, rev), ignore_errors=True)
        return [f"{repo}@{rev}" for rev in revisions]

    @contextlib.contextmanager
    def lock(self, repo: str) -> Iterator[None]:
        """The model's lock, held by a transfer and by a removal: never both at once, whichever
        process (the daemon, `agent models remove`). StoreError(busy) when it is held."""
        self.meta(repo).mkdir(parents=True, exist_ok=True)
        fd = os.open(self.meta(repo) / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreError(p.BUSY, f"busy: {repo} is being staged") from None
            yield
        finally:
            os.close(fd)


def at(revision: str | None) -> str:
    return f"@{revision}" if revision else ""


def gb(count: int) -> str:
    """Bytes for a person: GB, or MB below one."""
    return f"{count / 1e9:.2f} GB" if count >= 1e9 else f"{count / 1e6:.1f} MB"
