"""The same flows with the async clients."""

import asyncio

import pytest
from e2b import AsyncSandbox, CommandExitException, FileNotFoundException, SandboxQuery


async def test_lifecycle(async_sandbox):
    assert await async_sandbox.is_running()
    info = await async_sandbox.get_info()
    assert info.sandbox_id == async_sandbox.sandbox_id
    await async_sandbox.set_timeout(300)
    again = await AsyncSandbox.connect(async_sandbox.sandbox_id)
    assert (await again.commands.run("echo hi")).stdout == "hi\n"
    listed = await AsyncSandbox.list(query=SandboxQuery(metadata={})).next_items()
    assert async_sandbox.sandbox_id in [s.sandbox_id for s in listed]
    assert await async_sandbox.get_metrics()


async def test_commands(async_sandbox):
    out = []
    result = await async_sandbox.commands.run("echo a; sleep 0.2; echo b", on_stdout=out.append)
    assert result.stdout == "a\nb\n" and "".join(out) == "a\nb\n"
    with pytest.raises(CommandExitException):
        await async_sandbox.commands.run("exit 7")
    handle = await async_sandbox.commands.run("cat", background=True, stdin=True)
    await async_sandbox.commands.send_stdin(handle.pid, "async stdin")
    await async_sandbox.commands.close_stdin(handle.pid)
    assert (await handle.wait()).stdout == "async stdin"
    sleeper = await async_sandbox.commands.run("sleep 60", background=True)
    assert sleeper.pid in [p.pid for p in await async_sandbox.commands.list()]
    assert await async_sandbox.commands.kill(sleeper.pid)


async def test_files(async_sandbox):
    await async_sandbox.files.write("/tmp/async.txt", "content")
    assert await async_sandbox.files.read("/tmp/async.txt") == "content"
    assert await async_sandbox.files.exists("/tmp/async.txt")
    assert [e.name for e in await async_sandbox.files.list("/tmp") if e.name == "async.txt"] == ["async.txt"]
    with pytest.raises(FileNotFoundException):
        await async_sandbox.files.read("/tmp/missing")
    events = []
    handle = await async_sandbox.files.watch_dir("/tmp", on_event=events.append)
    await async_sandbox.files.write("/tmp/watched-async.txt", "x")
    for _ in range(30):
        if any(e.name == "watched-async.txt" for e in events):
            break
        await asyncio.sleep(0.1)
    await handle.stop()
    assert any(e.name == "watched-async.txt" for e in events)


async def test_code_interpreter(async_code_sandbox):
    await async_code_sandbox.run_code("z = 2")
    execution = await async_code_sandbox.run_code("print('p'); z * 21")
    assert execution.text == "42"
    assert execution.logs.stdout == ["p\n"]
    ctx = await async_code_sandbox.create_code_context()
    assert (await async_code_sandbox.run_code("z", context=ctx)).error.name == "NameError"
    await async_code_sandbox.remove_code_context(ctx)


async def test_twenty_sandboxes_concurrently():
    async def one(i):
        sbx = await AsyncSandbox.create(timeout=120, metadata={"concurrency": "20"})
        try:
            await sbx.files.write(f"/tmp/{i}.txt", str(i))
            result = await sbx.commands.run(f"cat /tmp/{i}.txt; echo; hostname")
            assert result.stdout.startswith(f"{i}\n")
            return sbx.sandbox_id
        finally:
            await sbx.kill()

    ids = await asyncio.gather(*(one(i) for i in range(20)))
    assert len(set(ids)) == 20
