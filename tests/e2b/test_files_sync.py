"""files.* with the sync client, including large, binary and gzip transfers."""

import gzip
import io
import os

import pytest
from e2b import FileNotFoundException, FileType, FilesystemEventType
from e2b.sandbox.filesystem.filesystem import WriteEntry


def test_write_read_text_and_bytes(sandbox):
    info = sandbox.files.write("/home/user/notes/a.txt", "hello")
    assert info.path == "/home/user/notes/a.txt"
    assert sandbox.files.read("/home/user/notes/a.txt") == "hello"
    assert sandbox.files.read("notes/a.txt") == "hello"  # relative to the home directory
    blob = bytes(range(256)) * 7
    sandbox.files.write("/tmp/blob.bin", blob)
    assert bytes(sandbox.files.read("/tmp/blob.bin", format="bytes")) == blob


def test_large_file_streams_both_ways(sandbox):
    data = os.urandom(24 << 20)
    sandbox.files.write("/tmp/large.bin", io.BytesIO(data))
    assert sandbox.commands.run("stat -c %s /tmp/large.bin").stdout.strip() == str(len(data))
    assert bytes(sandbox.files.read("/tmp/large.bin", format="bytes")) == data


def test_gzip_upload_and_download(sandbox):
    text = "compressible " * 10000
    sandbox.files.write("/tmp/z.txt", text, gzip=True)
    assert sandbox.files.read("/tmp/z.txt", gzip=True) == text
    chunks = b"".join(sandbox.files.read("/tmp/z.txt", format="stream"))
    assert chunks.decode() == text


def test_write_files_and_list(sandbox):
    infos = sandbox.files.write_files([
        WriteEntry(path="/tmp/multi/one.txt", data="1"),
        WriteEntry(path="/tmp/multi/two.bin", data=b"\x00\x01"),
        WriteEntry(path="/tmp/multi/sub/three.txt", data="3"),
    ])
    assert sorted(i.path for i in infos) == ["/tmp/multi/one.txt", "/tmp/multi/sub/three.txt", "/tmp/multi/two.bin"]
    entries = {e.name: e for e in sandbox.files.list("/tmp/multi")}
    assert set(entries) == {"one.txt", "two.bin", "sub"}
    assert entries["sub"].type == FileType.DIR
    assert entries["one.txt"].type == FileType.FILE
    assert entries["two.bin"].size == 2
    deep = {e.path for e in sandbox.files.list("/tmp/multi", depth=2)}
    assert "/tmp/multi/sub/three.txt" in deep


def test_exists_get_info_make_dir_rename_remove(sandbox):
    assert not sandbox.files.exists("/tmp/d")
    assert sandbox.files.make_dir("/tmp/d/e") is True
    assert sandbox.files.make_dir("/tmp/d/e") is False
    assert sandbox.files.exists("/tmp/d/e")
    sandbox.files.write("/tmp/d/f.txt", "x")
    info = sandbox.files.get_info("/tmp/d/f.txt")
    assert info.type == FileType.FILE and info.size == 1 and info.owner == "user"
    moved = sandbox.files.rename("/tmp/d/f.txt", "/tmp/d/g.txt")
    assert moved.path == "/tmp/d/g.txt"
    assert not sandbox.files.exists("/tmp/d/f.txt")
    sandbox.files.remove("/tmp/d")
    assert not sandbox.files.exists("/tmp/d")


def test_missing_files_raise_file_not_found(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/nope/missing.txt")
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info("/nope")
    with pytest.raises(FileNotFoundException):
        sandbox.files.list("/nope")


def test_watch_dir(sandbox):
    sandbox.files.make_dir("/tmp/watched")
    handle = sandbox.files.watch_dir("/tmp/watched")
    try:
        sandbox.files.write("/tmp/watched/new.txt", "x")
        sandbox.commands.run("rm /tmp/watched/new.txt")
        import time

        events = []
        for _ in range(20):
            events.extend(handle.get_new_events())
            if any(e.type == FilesystemEventType.REMOVE for e in events):
                break
            time.sleep(0.1)
        names = {(e.name, e.type) for e in events}
        assert ("new.txt", FilesystemEventType.CREATE) in names
        assert ("new.txt", FilesystemEventType.REMOVE) in names
    finally:
        handle.stop()


def test_upload_and_download_urls(sandbox):
    import urllib.request

    sandbox.files.write("/tmp/url.txt", "via url")
    with urllib.request.urlopen(sandbox.download_url("/tmp/url.txt")) as response:
        assert response.read() == b"via url"
