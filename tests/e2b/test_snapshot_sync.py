"""Snapshots and forks with the sync client: create_snapshot, Sandbox.create(snapshot_id),
fork, delete_snapshot."""

from e2b import Sandbox


def test_snapshot_then_create_from_it_and_delete_it():
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/state.txt", "before snapshot")
        snapshot = sbx.create_snapshot(name="e2b-snap")
        assert snapshot.snapshot_id
        assert snapshot.names == ["e2b-snap"]
        sbx.files.write("/home/user/state.txt", "after snapshot")

        clone = Sandbox.create(snapshot.snapshot_id, timeout=60)
        try:
            assert clone.sandbox_id != sbx.sandbox_id
            assert clone.files.read("/home/user/state.txt") == "before snapshot"
        finally:
            clone.kill()
        assert sbx.files.read("/home/user/state.txt") == "after snapshot"

        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is False
    finally:
        sbx.kill()


def test_fork_gives_independent_copies():
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/origin.txt", "shared past")
        forks = sbx.fork(count=2, timeout=60)
        assert len(forks) == 2
        for i, fork in enumerate(forks):
            assert isinstance(fork, Sandbox), fork
            assert fork.files.read("/home/user/origin.txt") == "shared past"
            fork.files.write("/home/user/mine.txt", f"fork {i}")
        assert forks[0].files.read("/home/user/mine.txt") == "fork 0"
        assert forks[1].files.read("/home/user/mine.txt") == "fork 1"
        assert not sbx.files.exists("/home/user/mine.txt")
        for fork in forks:
            fork.kill()
    finally:
        sbx.kill()
