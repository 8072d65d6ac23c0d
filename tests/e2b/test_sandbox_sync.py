"""Sandbox lifecycle with the sync client: create, connect, info, timeout, list, metrics, kill."""

import uuid

import pytest
from e2b import Sandbox, SandboxNotFoundException, SandboxQuery, SandboxState
from e2b_code_interpreter import Sandbox as CodeSandbox


def test_create_with_template_timeout_metadata_envs():
    tag = uuid.uuid4().hex
    sbx = Sandbox.create("base", timeout=60, metadata={"tag": tag}, envs={"GREETING": "hi there"})
    try:
        assert sbx.is_running()
        assert sbx.commands.run("echo $GREETING").stdout == "hi there\n"
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.template_id == "base"
        assert info.metadata == {"tag": tag}
        assert info.state == SandboxState.RUNNING
        assert (info.end_at - info.started_at).total_seconds() == pytest.approx(60, abs=5)
    finally:
        sbx.kill()
    assert not sbx.is_running()


def test_code_interpreter_template_exists():
    sbx = CodeSandbox.create()
    try:
        assert sbx.get_info().template_id == "code-interpreter-v1"
    finally:
        sbx.kill()


def test_unknown_template_is_refused():
    with pytest.raises(Exception):
        Sandbox.create("no-such-template")


def test_set_timeout_moves_the_end(sandbox):
    before = sandbox.get_info().end_at
    sandbox.set_timeout(600)
    after = sandbox.get_info().end_at
    assert (after - before).total_seconds() > 400


def test_connect_by_id_reaches_the_same_sandbox(sandbox):
    sandbox.files.write("/tmp/marker", "here")
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.files.read("/tmp/marker") == "here"
    assert again.commands.run("cat /tmp/marker").stdout == "here"


def test_list_filters_by_metadata_and_state_and_paginates():
    tag = uuid.uuid4().hex
    sandboxes = [Sandbox.create(timeout=60, metadata={"list-test": tag, "n": str(i)}) for i in range(3)]
    try:
        query = SandboxQuery(metadata={"list-test": tag}, state=[SandboxState.RUNNING])
        paginator = Sandbox.list(query=query, limit=2)
        seen = []
        while paginator.has_next:
            page = paginator.next_items()
            assert len(page) <= 2
            seen.extend(s.sandbox_id for s in page)
        assert sorted(seen) == sorted(s.sandbox_id for s in sandboxes)

        paused = Sandbox.list(query=SandboxQuery(metadata={"list-test": tag}, state=[SandboxState.PAUSED]))
        assert paused.next_items() == []

        only_one = Sandbox.list(query=SandboxQuery(metadata={"list-test": tag, "n": "1"})).next_items()
        assert [s.sandbox_id for s in only_one] == [sandboxes[1].sandbox_id]
        assert only_one[0].metadata["n"] == "1"
    finally:
        for sbx in sandboxes:
            sbx.kill()
    assert Sandbox.list(query=SandboxQuery(metadata={"list-test": tag})).next_items() == []


def test_metrics(sandbox):
    sandbox.commands.run("python3 -c 'x = bytearray(20 << 20)'")
    metrics = sandbox.get_metrics()
    assert metrics
    assert metrics[-1].mem_total > 0
    assert metrics[-1].cpu_count >= 1


def test_kill_by_id_and_unknown_sandboxes():
    sbx = Sandbox.create(timeout=60)
    assert Sandbox.kill(sbx.sandbox_id) is True
    assert Sandbox.kill(sbx.sandbox_id) is False
    assert not sbx.is_running()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info("doesnotexist0000")


def test_calls_on_a_killed_sandbox_raise_sdk_exceptions():
    from e2b import SandboxException

    sbx = Sandbox.create(timeout=60)
    sbx.kill()
    with pytest.raises(SandboxException) as raised:
        sbx.commands.run("true")
    assert "not running" in str(raised.value) or "not found" in str(raised.value)
    with pytest.raises(SandboxException):
        sbx.files.read("/etc/hostname")


def test_context_manager_kills_on_exit():
    with Sandbox.create(timeout=60) as sbx:
        assert sbx.commands.run("true").exit_code == 0
    assert not sbx.is_running()
