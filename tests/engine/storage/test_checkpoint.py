from __future__ import annotations

from pyroaring import BitMap64

from engine.storage.checkpoint import (
    Checkpoint,
    CheckpointStore,
    decode_checkpoint,
    encode_checkpoint,
)
from engine.storage.disk import FakeDisk


def cp(index: int, term: int = 2) -> Checkpoint:
    return Checkpoint(index, term, 1, b"cfg", BitMap64([1, index]), f"state@{index}".encode())


def test_checkpoint_encoding_round_trips_and_detects_any_flipped_bit() -> None:
    data = encode_checkpoint(cp(9))
    assert decode_checkpoint(data) == cp(9)
    for bit in range(0, len(data) * 8, 7):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        assert decode_checkpoint(bytes(damaged)) is None
    assert decode_checkpoint(data[:-1]) is None


def test_the_size_of_a_checkpoint_is_known_from_its_write_and_its_read() -> None:
    """Nobody encodes a checkpoint again to learn its size (a copy of the whole state)."""
    store = CheckpointStore(FakeDisk(), "q", kept_max=3)
    size = store.write(cp(10))
    assert size == len(encode_checkpoint(cp(10)))
    found, _ = store.load_newest()
    assert found is not None and found.file_bytes == size
    assert store.install_snapshot(cp(20)) == len(encode_checkpoint(cp(20)))
    snapshot = store.read_snapshot()
    assert snapshot is not None and snapshot.file_bytes == len(encode_checkpoint(cp(20)))


def test_at_most_k_kept_thinned_from_the_middle() -> None:
    store = CheckpointStore(FakeDisk(), "q", kept_max=3)
    for index in (10, 20, 25, 40, 80):
        store.write(cp(index))
    assert store.checkpoint_indexes() == [10, 40, 80]


def test_newest_valid_checkpoint_wins_and_a_damaged_one_is_passed_over() -> None:
    disk = FakeDisk()
    store = CheckpointStore(disk, "q", kept_max=4)
    store.write(cp(10))
    store.write(cp(20))
    disk.flip_bit("queues/q/checkpoints/00000000000000000020.chk", 100)
    found, damaged = store.load_newest()
    assert found == cp(10) and damaged == ["queues/q/checkpoints/00000000000000000020.chk"]


def test_write_is_atomic_across_a_crash() -> None:
    disk = FakeDisk()
    store = CheckpointStore(disk, "q", kept_max=4)
    store.write(cp(10))
    disk.crash()
    store = CheckpointStore(disk, "q", kept_max=4)
    assert store.load_newest() == (cp(10), [])


def test_promotion_moves_the_newest_eligible_checkpoint_to_the_snapshot() -> None:
    disk = FakeDisk()
    store = CheckpointStore(disk, "q", kept_max=4)
    for index in (10, 20, 30):
        store.write(cp(index))
    assert store.promote(25) == 20
    assert store.snapshot_index() == 20 and store.checkpoint_indexes() == [30]
    assert store.read_snapshot() == cp(20)
    assert store.promote(5) is None
    disk.crash()
    store = CheckpointStore(disk, "q", kept_max=4)
    assert store.snapshot_index() == 20 and store.load_newest()[0] == cp(30)
