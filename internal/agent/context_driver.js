'use strict';
// Code-context driver for airlock-agent: reads JSON-line requests on fd 3,
// evaluates them in one persistent REPL context, and writes JSON-line
// events on fd 4. Not a module: run as `node driver.js`.
const fs = require('fs');
const repl = require('repl');
const util = require('util');
const vm = require('vm');
const guard = vm.createContext({});
const { PassThrough } = require('stream');

function emit(ev) { fs.writeSync(4, JSON.stringify(ev) + '\n'); }

function hook(stream, kind) {
  stream.write = function (chunk, encoding, cb) {
    if (typeof encoding === 'function') { cb = encoding; encoding = undefined; }
    const s = Buffer.isBuffer(chunk) ? chunk.toString('base64') : Buffer.from(String(chunk), encoding || 'utf8').toString('base64');
    emit({ t: kind, d: s });
    if (cb) process.nextTick(cb);
    return true;
  };
}
hook(process.stdout, 'stdout');
hook(process.stderr, 'stderr');

const r = repl.start({
  input: new PassThrough(),
  output: new PassThrough(),
  prompt: '',
  terminal: false,
  useGlobal: false,
  ignoreUndefined: true,
  breakEvalOnSigint: true,
});
r.output.resume();
r.context.console = new console.Console(process.stdout, process.stderr);
// The REPL evaluates inside a domain that reports thrown errors to its own
// printer instead of the callback: route them to the call in progress.
let current = null; // callback of the eval in progress
r._domain.removeAllListeners('error');
r._domain.on('error', (err) => { if (current) current(err); else emit(describe(err)); });

let pending = null; // reject function of the promise being awaited
process.on('SIGINT', () => {
  if (pending) pending(Object.assign(new Error('Script execution was interrupted by `SIGINT`'), { name: 'Interrupted' }));
});

function describe(err) {
  if (err instanceof Error || (err && typeof err === 'object' && 'stack' in err)) {
    // Drop the driver's own frames (from the vm call down).
    const stack = String(err.stack || '').split('\n');
    const cut = stack.findIndex((l) => /\bat (sigintHandlersWrap|ContextifyScript\.runInContext|Script\.runInContext)\b/.test(l));
    return { t: 'error', name: String(err.name || 'Error'), message: String(err.message ?? ''), stack: (cut > 0 ? stack.slice(0, cut) : stack).join('\n') };
  }
  return { t: 'error', name: 'Uncaught', message: util.inspect(err), stack: '' };
}

function run(code) {
  return new Promise((resolve) => {
    const cb = (err, result) => {
      if (current !== cb) return;
      current = null;
      if (err) {
        if (err instanceof repl.Recoverable) err = err.err;
        resolve({ err });
      } else {
        resolve({ result });
      }
    };
    current = cb;
    // Run the REPL's eval under a SIGINT watchdog of our own: an interrupt
    // terminates the synchronous part of the code with an error.
    guard.evaluate = () => r.eval(code, r.context, 'cell', cb);
    try {
      vm.runInContext('evaluate()', guard, { breakOnSigint: true });
    } catch (err) {
      if (process.domain === r._domain) r._domain.exit();
      cb(err);
    }
  }).then(async (res) => {
    if (!res.err && res.result && typeof res.result.then === 'function') {
      try {
        res.result = await new Promise((resolve, reject) => {
          pending = reject;
          res.result.then(resolve, reject);
        });
      } catch (err) {
        res = { err };
      } finally {
        pending = null;
      }
    }
    return res;
  });
}

process.on('uncaughtException', (err) => emit(describe(err)));
process.on('unhandledRejection', (err) => emit(describe(err)));

let queue = Promise.resolve();
const rl = require('readline').createInterface({ input: fs.createReadStream(null, { fd: 3 }) });
rl.on('line', (line) => {
  const req = JSON.parse(line);
  queue = queue.then(async () => {
    const res = await run(req.code);
    if (res.err !== undefined) {
      emit(describe(res.err));
    } else if (res.result !== undefined) {
      emit({ t: 'result', text: util.inspect(res.result, { colors: false }) });
    }
    emit({ t: 'done', id: req.id });
  });
});
rl.on('close', () => process.exit(0));
