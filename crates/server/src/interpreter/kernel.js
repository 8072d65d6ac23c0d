// corral's JavaScript kernel: the same JSON-lines protocol as kernel.py, on Node's `vm`.
// Every cell runs in one persistent context, so declarations persist between cells; the
// completion value of a cell is its result. Promises returned by a cell are awaited.
'use strict';
const vm = require('vm');
const util = require('util');
const readline = require('readline');

const write = (message) => process.stdout.write(JSON.stringify(message) + '\n');
let current = null;

const emit = (type) => (...args) => {
  write({ id: current, type, text: util.format(...args) + '\n' });
};
const sandboxConsole = {
  log: emit('stdout'), info: emit('stdout'), debug: emit('stdout'),
  error: emit('stderr'), warn: emit('stderr'), trace: emit('stderr'),
  dir: (value) => emit('stdout')(util.inspect(value)),
  table: (value) => emit('stdout')(util.inspect(value)),
};
const context = vm.createContext({
  console: sandboxConsole, require, process, Buffer, setTimeout, clearTimeout,
  setInterval, clearInterval, setImmediate, clearImmediate, URL, TextEncoder, TextDecoder,
  fetch: globalThis.fetch,
});

function result(value) {
  const message = { id: current, type: 'result', is_main_result: true, text: util.inspect(value) };
  if (value !== null && typeof value === 'object') {
    try {
      message.json = JSON.parse(JSON.stringify(value));
    } catch (_) { /* not JSON-able: text only */ }
  }
  write(message);
}

function error(err) {
  const name = (err && err.name) || 'Error';
  const value = err && err.message !== undefined ? String(err.message) : String(err);
  const traceback = (err && err.stack) || `${name}: ${value}`;
  write({ id: current, type: 'error', name, value, traceback });
}

let count = 0;
async function run(request) {
  current = request.id;
  const env = request.env || {};
  const saved = {};
  for (const key of Object.keys(env)) {
    saved[key] = process.env[key];
    process.env[key] = String(env[key]);
  }
  try {
    count += 1;
    let value = vm.runInContext(request.code || '', context, { filename: `cell-${count}.js` });
    if (value && typeof value.then === 'function') {
      value = await value;
    }
    if (value !== undefined) result(value);
  } catch (err) {
    error(err);
  } finally {
    for (const key of Object.keys(saved)) {
      if (saved[key] === undefined) delete process.env[key];
      else process.env[key] = saved[key];
    }
    write({ id: request.id, type: 'end' });
    current = null;
  }
}

// A SIGINT interrupts nothing synchronous in Node; it must at least not end the kernel.
process.on('SIGINT', () => {});

const queue = [];
let busy = false;
async function drain() {
  if (busy) return;
  busy = true;
  while (queue.length) await run(queue.shift());
  busy = false;
}
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  if (!line.trim()) return;
  try {
    queue.push(JSON.parse(line));
  } catch (err) {
    return;
  }
  drain();
});
