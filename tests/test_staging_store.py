"""agent.staging's store and partial transfers on a real file system: what is refused before any
byte moves (a store that is a file, one on a read-only mount), what a record of verified chunks
keeps across a kill, and removal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.staging.listing import held_models
from agent.staging.partial import PartialTransfer, read_record
from agent.staging.store import ModelStore, StoreError, hash_files
from shared.staging.manifest import MIN_CHUNK_SIZE, build, chunk_hash
from tests.disk_support import mounted_tmpfs

CHUNK = MIN_CHUNK_SIZE
REV = "0123456789abcdef0123456789abcdef01234567"


def manifest_of(folder: Path, files: dict[str, bytes]):  # noqa: ANN201 - a Manifest
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return build("org/m", REV, CHUNK, hash_files(folder, CHUNK))


def test_a_store_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is a file") as refused:
        ModelStore(tmp_path / "file" / "store").check_writable()
    assert refused.value.code == "bad-store"
    ModelStore(tmp_path / "not-yet" / "store").check_writable()  # made when staged
    assert not (tmp_path / "not-yet").exists()


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as mount:
        yield mount


def test_a_store_on_a_read_only_file_system_is_refused(read_only: Path) -> None:
    with pytest.raises(StoreError, match="is on a read-only file system"):
        ModelStore(read_only / "store").check_writable()


def test_room_counts_the_margin(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.check_room("org/m", 1000, 1000)
    with pytest.raises(StoreError, match=r"no room for org/m \(.* margin\): .* free on") as full:
        store.check_room("org/m", 10**18, 10**18)
    assert full.value.code == "no-space"


def test_a_record_keeps_what_was_verified_across_a_kill(tmp_path: Path) -> None:
    data = bytes(range(256)) * 12  # 3,072 bytes: 3 chunks
    manifest = manifest_of(tmp_path / "src", {"w.bin": data})
    folder = tmp_path / "partial"
    transfer = PartialTransfer.open(folder, manifest)
    transfer.write("w.bin", 0, data[:CHUNK])
    transfer.write("w.bin", 1, data[CHUNK : 2 * CHUNK])
    with open(folder / "records" / "w.bin", "a") as record:
        record.write("2")  # a line the kill cut: not a line
    assert read_record(folder, "w.bin", 3) == {0, 1}
    again = PartialTransfer.open(folder, manifest)  # the same manifest: resumed
    assert again.held_bytes() == 2 * CHUNK
    hasher, first = again.resume("w.bin")
    assert first == 2 and hasher.size == 2 * CHUNK
    with open(folder / "files" / "w.bin", "r+b") as handle:  # the disk lost chunk 1
        handle.seek(CHUNK + 5)
        handle.write(b"\x00")
    assert again.resume("w.bin")[1] == 1  # fetched again from there
    other = manifest_of(tmp_path / "other", {"w.bin": data[::-1]})
    fresh = PartialTransfer.open(folder, other)  # another manifest: started afresh
    assert fresh.held_bytes() == 0 and chunk_hash(data[:CHUNK]) == manifest.files[0].chunks[0]


def test_a_placed_model_is_listed_checked_and_removed(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    manifest = manifest_of(tmp_path / "src", {"config.json": b"{}", "w.bin": b"w" * 2000})
    folder = store.partial_dir("org/m", REV)
    transfer = PartialTransfer.open(folder, manifest)
    for entry in manifest.files:
        for index in range(len(entry.chunks)):
            data = (tmp_path / "src" / entry.path).read_bytes()
            transfer.write(entry.path, index, data[index * CHUNK : (index + 1) * CHUNK])
    (listed,) = held_models(store)
    assert (listed["state"], listed["bytes"], listed["size"]) == ("partial", 2002, 2002)
    store.place(manifest, transfer.files, "main")
    (listed,) = held_models(store)
    assert (listed["state"], listed["digest"], listed["refs"]) == (
        "present",
        manifest.digest,
        ["main"],
    )
    (store.snapshot("org/m", REV) / "w.bin").write_bytes(b"x" * 2000)
    (listed,) = held_models(store)
    assert listed["state"] == "mismatch" and listed["error"].startswith("w.bin differs")
    with store.lock("org/m"), pytest.raises(StoreError) as staging:  # a transfer holds it
        store.remove("org/m", None, partial_only=False)
    assert staging.value.code == "busy"
    assert store.remove("org/m", "main", partial_only=False) == [f"org/m@{REV}"]
    assert held_models(store) == []
    with pytest.raises(StoreError) as nothing:
        store.remove("org/m", None, partial_only=False)
    assert nothing.value.code == "not-held"
