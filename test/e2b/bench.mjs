// Benchmark of the E2B SDK path (issue #14): Sandbox.create() and the
// first commands.run('true') with the official SDK (`e2b` 2.51.0, the
// version package.json pins), configured only through E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY, against `airlock serve`.
//
//   node bench.mjs [--paced] N
//
// N times: create a sandbox (default template and lifetime), run `true` in
// it, stop the clock, then kill the sandbox outside the timed part. One JSON
// line per iteration on stdout: {"i", "sandbox_id", "create_ms", "run_ms",
// "total_ms"}. With --paced each iteration waits for a line on stdin, so
// that a driver can interleave it with other work: cmd/airlock-bench does,
// alternating it with the same through airlock's /v1 API
// (`airlock-bench --only e2b`). Needs node >= 20; `npm ci` in this folder.
import { Sandbox } from "e2b";
import { createInterface } from "node:readline";

const args = process.argv.slice(2);
const paced = args.includes("--paced");
const rest = args.filter((a) => a !== "--paced");
const n = Number(rest[0] ?? 5);
if (rest.length > 1 || !Number.isInteger(n) || n < 1) {
  console.error("usage: node bench.mjs [--paced] N");
  process.exit(2);
}
for (const v of ["E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"]) {
  if (!process.env[v]) {
    console.error(`bench.mjs: set ${v} (see the README's E2B compatibility section)`);
    process.exit(2);
  }
}

const lines = paced ? createInterface({ input: process.stdin })[Symbol.asyncIterator]() : null;
const round = (x) => Math.round(x * 10) / 10;
for (let i = 0; i < n; i++) {
  if (lines && (await lines.next()).done) break;
  const t0 = performance.now();
  const sbx = await Sandbox.create();
  const t1 = performance.now();
  let t2;
  try {
    await sbx.commands.run("true"); // throws CommandExitError unless it exits 0
    t2 = performance.now();
  } finally {
    await sbx.kill(); // untimed; done before the line, so a driver's next step starts after it
  }
  console.log(JSON.stringify({ i, sandbox_id: sbx.sandboxId, create_ms: round(t1 - t0), run_ms: round(t2 - t1), total_ms: round(t2 - t0) }));
}
// The SDK's pooled connections would keep node alive for a while.
process.exit(0);
