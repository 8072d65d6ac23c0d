"""Pause and resume with the sync client: beta_pause, state in info and list, connect resumes."""

import uuid

from e2b import Sandbox, SandboxQuery, SandboxState
from e2b_code_interpreter import Sandbox as CodeSandbox


def test_pause_then_connect_resumes_with_files_and_processes():
    tag = uuid.uuid4().hex
    sbx = Sandbox.create(timeout=120, metadata={"pause-test": tag})
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        sleeper = sbx.commands.run("sleep 300", background=True)
        assert sbx.beta_pause() is True
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
        # Already paused: E2B answers 409, which the SDK reports as False.
        assert sbx.beta_pause() is False

        paused = Sandbox.list(query=SandboxQuery(metadata={"pause-test": tag}, state=[SandboxState.PAUSED])).next_items()
        assert [s.sandbox_id for s in paused] == [sbx.sandbox_id]
        assert paused[0].state == SandboxState.PAUSED
        running = Sandbox.list(query=SandboxQuery(metadata={"pause-test": tag}, state=[SandboxState.RUNNING])).next_items()
        assert running == []

        again = Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert again.get_info().state == SandboxState.RUNNING
        assert again.files.read("/home/user/kept.txt") == "kept"
        assert again.commands.run("echo back").stdout == "back\n"
        assert sleeper.pid in [p.pid for p in again.commands.list()]
    finally:
        sbx.kill()


def test_interpreter_state_survives_pause_and_resume():
    sbx = CodeSandbox.create(timeout=120)
    try:
        sbx.run_code("counter = 41")
        sbx.pause()
        again = CodeSandbox.connect(sbx.sandbox_id)
        assert again.run_code("counter + 1").text == "42"
    finally:
        sbx.kill()
