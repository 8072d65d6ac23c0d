// The JS SDK against corral: create, commands, files, run_code, kill.
import { Sandbox } from '@e2b/code-interpreter'
import assert from 'node:assert/strict'

const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { suite: 'e2b-js' } })
try {
  const cmd = await sbx.commands.run('echo hello from $0; exit 0')
  assert.equal(cmd.exitCode, 0)
  assert.match(cmd.stdout, /hello from/)
  await assert.rejects(sbx.commands.run('exit 4'), (err) => err.exitCode === 4)

  await sbx.files.write('/tmp/js.txt', 'written by js')
  assert.equal(await sbx.files.read('/tmp/js.txt'), 'written by js')
  assert.ok((await sbx.files.list('/tmp')).some((e) => e.name === 'js.txt'))

  await sbx.runCode('x = 20')
  const execution = await sbx.runCode('print("py"); x + 22')
  assert.equal(execution.text, '42')
  assert.deepEqual(execution.logs.stdout, ['py\n'])
  const js = await sbx.runCode('[1, 2, 3].map((n) => n * 2)', { language: 'js' })
  assert.match(js.text, /2, 4, 6/)
  const failed = await sbx.runCode('1 / 0')
  assert.equal(failed.error.name, 'ZeroDivisionError')
} finally {
  await sbx.kill()
}
assert.equal(await sbx.isRunning(), false)
console.log('JS SDK scenario passed')
