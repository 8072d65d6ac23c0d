"""commands.* with the sync client."""

import time

import pytest
from e2b import CommandExitException, TimeoutException


def test_run_returns_output_and_exit_code(sandbox):
    result = sandbox.commands.run("echo out; echo err >&2")
    assert result.exit_code == 0
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"


def test_streamed_callbacks(sandbox):
    out, err = [], []
    sandbox.commands.run("for i in 1 2 3; do echo $i; sleep 0.1; done; echo oops >&2",
                         on_stdout=out.append, on_stderr=err.append)
    assert "".join(out) == "1\n2\n3\n"
    assert "".join(err) == "oops\n"


def test_nonzero_exit_raises_command_exit_exception(sandbox):
    with pytest.raises(CommandExitException) as raised:
        sandbox.commands.run("echo partial; exit 3")
    assert raised.value.exit_code == 3
    assert raised.value.stdout == "partial\n"


def test_envs_cwd_user(sandbox):
    result = sandbox.commands.run("echo $FOO; pwd; whoami", envs={"FOO": "bar"}, cwd="/tmp")
    assert result.stdout == "bar\n/tmp\nuser\n"
    assert sandbox.commands.run("echo ${FOO:-unset}").stdout == "unset\n"
    assert sandbox.commands.run("whoami", user="root").stdout == "root\n"
    assert sandbox.commands.run("pwd").stdout == "/home/user\n"


def test_timeout_raises_and_kills(sandbox):
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)


def test_background_wait_and_kill(sandbox):
    handle = sandbox.commands.run("sleep 0.5; echo done", background=True)
    result = handle.wait()
    assert result.stdout == "done\n"

    sleeper = sandbox.commands.run("sleep 60", background=True)
    pids = [p.pid for p in sandbox.commands.list()]
    assert sleeper.pid in pids
    assert sleeper.kill() is True
    with pytest.raises(CommandExitException):
        sleeper.wait()
    assert sleeper.pid not in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(999999) is False


def test_stdin_send_and_close(sandbox):
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "hello ")
    handle.send_stdin("world")
    sandbox.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "hello world"


def test_connect_to_running_command(sandbox):
    handle = sandbox.commands.run("sleep 1; echo late", background=True)
    again = sandbox.commands.connect(handle.pid)
    assert again.wait().stdout == "late\n"


def test_list_shows_command_details(sandbox):
    handle = sandbox.commands.run("sleep 30", background=True, envs={"K": "V"}, cwd="/tmp")
    try:
        info = next(p for p in sandbox.commands.list() if p.pid == handle.pid)
        assert info.cmd == "/bin/bash"
        assert "sleep 30" in info.args[-1]
        assert info.cwd == "/tmp"
    finally:
        handle.kill()


def test_pty(sandbox):
    from e2b import PtySize

    output = bytearray()
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(terminal.pid, b"echo pty-$((40+2))\n")
    sandbox.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
    sandbox.pty.send_stdin(terminal.pid, b"exit\n")
    terminal.wait(on_pty=output.extend)
    assert b"pty-42" in output


def test_large_output_streams_through(sandbox):
    result = sandbox.commands.run("head -c 6000000 /dev/zero | base64 -w 0")
    assert len(result.stdout) == 8000000


def test_sandbox_killed_during_run_raises(sandbox):
    from e2b import SandboxException, Sandbox

    handle = sandbox.commands.run("sleep 60", background=True)
    Sandbox.kill(sandbox.sandbox_id)
    with pytest.raises(SandboxException):
        handle.wait()
