// What the E2B SDK test files share: the airlock CLI on the test's state
// dir, and an `airlock serve` on a free loopback port (with preview hosts
// under localhost:<port>, reached with a Host header, no DNS needed) that
// the SDKs are pointed at with E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY, and nothing else.
import { spawn, execFileSync } from "node:child_process";
import net from "node:net";

export const BIN = process.env.AIRLOCK_BIN;
export const STATE = process.env.AIRLOCK_TEST_STATE_DIR;
if (!BIN || !STATE) throw new Error("set AIRLOCK_BIN and AIRLOCK_TEST_STATE_DIR (see scripts/test-e2b.sh)");

export const airlock = (...args) => execFileSync(BIN, ["--state-dir", STATE, ...args], { encoding: "utf8" });

// sandboxState is a sandbox's state as `airlock ls` shows it ("gone" when
// it is not listed).
export const sandboxState = (id) => {
  const line = airlock("ls").split("\n").find((l) => l.startsWith(id));
  return line ? line.split(/\s+/)[1] : "gone";
};

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// startServe starts the server, makes a key for tenant and one for
// `${tenant}-other`, and sets the three E2B variables to the first.
export async function startServe(tenant) {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const proc = spawn(BIN, ["--state-dir", STATE, "serve", "--listen", `127.0.0.1:${port}`, "--preview-domain", `localhost:${port}`], { stdio: ["ignore", "pipe", "inherit"] });
  await new Promise((resolve, reject) => {
    proc.stdout.on("data", (d) => { if (String(d).includes("listening")) resolve(); });
    proc.on("exit", (code) => reject(new Error(`serve exited ${code}`)));
  });
  const key = airlock("keys", "create", "--tenant", tenant).trim();
  const otherKey = airlock("keys", "create", "--tenant", `${tenant}-other`).trim();
  process.env.E2B_API_URL = url;
  process.env.E2B_SANDBOX_URL = url;
  process.env.E2B_API_KEY = key;
  return { url, key, otherKey, stop: () => proc.kill("SIGTERM") };
}
