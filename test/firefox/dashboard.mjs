// Drives the web dashboard of a running `airlock serve` in Firefox ESR
// (Debian's firefox-esr, headless, over WebDriver BiDi with puppeteer-core;
// puppeteer downloads no browser). TestDashboardFirefox (test/e2e) starts
// the server, makes the key and the sandbox, runs this script and asserts on
// the one JSON object it prints on stdout:
//
//   {browser, steps: [{name, ms}], problems: [...], failed: {step, error, url, text} | null,
//    terminal: {rows, cols}, width: {page: view}}
//
// Steps: sign in with the key, see the sandbox in the list, open its page,
// open the terminal and run `echo hi` (see `hi`), open the Server page, sign
// out. Every console error or warning, uncaught page error and
// Content-Security-Policy violation is a problem (the watcher is proved first
// with a console.error of its own). A full-page screenshot of each page goes
// to $ARTEFACTS/<n>-<page>.png; a failed step leaves failed-<step>.png.
//
// Environment: AIRLOCK_URL (http://127.0.0.1:PORT), AIRLOCK_KEY, SANDBOX_ID,
// TENANT (the key's tenant), ARTEFACTS (a directory), FIREFOX (the browser's
// path; /usr/bin/firefox-esr if unset).
import fs from 'node:fs';
import path from 'node:path';
import puppeteer from 'puppeteer-core';

const need = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`dashboard.mjs: set ${k}`);
  return v;
};
const base = need('AIRLOCK_URL');
const key = need('AIRLOCK_KEY');
const id = need('SANDBOX_ID');
const tenant = need('TENANT');
const art = need('ARTEFACTS');
const firefox = process.env.FIREFOX || '/usr/bin/firefox-esr';
const stepTimeout = 120_000;

const out = { browser: '', steps: [], problems: [], failed: null, terminal: null, width: {} };
let watching = true;
const problem = (p) => { if (watching) out.problems.push(p); };

const browser = await puppeteer.launch({
  browser: 'firefox',
  executablePath: firefox,
  headless: true,
  defaultViewport: { width: 1280, height: 800 },
  // The profile's own prompts and telemetry stay off; nothing leaves the
  // machine.
  extraPrefsFirefox: {
    'browser.shell.checkDefaultBrowser': false,
    'datareporting.policy.dataSubmissionEnabled': false,
    'toolkit.telemetry.reportingpolicy.firstRun': false,
  },
});
try {
  out.browser = await browser.version();
  const page = await browser.newPage();
  page.setDefaultTimeout(stepTimeout);
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warn') {
      const loc = m.location();
      problem(`console.${m.type()}: ${m.text()}${loc && loc.url ? ` (${loc.url}:${loc.lineNumber})` : ''}`);
    }
  });
  page.on('pageerror', (e) => problem(`page error: ${e && e.message ? e.message : e}`));
  page.on('dialog', async (d) => {
    problem(`a ${d.type()} dialog opened: ${JSON.stringify(d.message())}`);
    await d.dismiss().catch(() => {});
  });
  // A refused script, style or connection under the pages' CSP fires
  // securitypolicyviolation; report it on the console, which is watched.
  await page.evaluateOnNewDocument(() => {
    document.addEventListener('securitypolicyviolation', (e) => {
      console.error(`CSP violation: ${e.violatedDirective} blocked ${e.blockedURI || 'inline'} (${e.sourceFile || ''}:${e.lineNumber || 0})`);
    });
  });

  const shot = (name) => page.screenshot({ path: path.join(art, `${name}.png`), fullPage: true });
  const step = async (name, fn) => {
    const t0 = Date.now();
    try {
      await fn();
    } catch (e) {
      let url = '', text = '';
      try {
        url = page.url();
        text = await page.evaluate(() => (document.body ? document.body.innerText : ''));
        await shot(`failed-${name.replaceAll(' ', '-')}`);
      } catch { /* the page is gone: keep the step's own error */ }
      out.failed = { step: name, error: String(e && e.stack ? e.stack : e), url, text };
      throw e;
    }
    out.steps.push({ name, ms: Date.now() - t0 });
  };
  const until = (fn, ...args) => page.waitForFunction(fn, { timeout: stepTimeout, polling: 100 }, ...args);
  const width = async (what) => {
    out.width[what] = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
  };
  const row = `tr[data-id="${id}"]`;

  // The watcher catches what it must: a console.error and a CSP violation
  // on a dashboard page make problems (the pages must then make none).
  await step('prove the watcher', async () => {
    await page.goto(`${base}/ui/sign-in`);
    await page.evaluate(() => {
      console.error('probe of the console watcher');
      const s = document.createElement('script');
      s.src = 'http://probe.invalid/csp.js';
      document.head.append(s);
    });
    const deadline = Date.now() + 10_000;
    const caught = () => ['probe of the console watcher', 'CSP violation'].every((w) => out.problems.some((p) => p.includes(w)));
    while (!caught() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    if (!caught()) throw new Error(`the watcher missed the probes: ${JSON.stringify(out.problems)}`);
    out.problems = [];
  });

  // Signed out, / leads to the sign-in page; the key signs in and the list
  // shows the sandbox made through the API, running, with its metadata.
  await step('sign in', async () => {
    await page.goto(`${base}/`);
    await page.waitForSelector('#key', { visible: true });
    if (!page.url().endsWith('/ui/sign-in')) throw new Error(`signed out, / went to ${page.url()}`);
    await shot('1-sign-in');
    await width('sign-in');
    await page.type('#key', key);
    await Promise.all([page.waitForNavigation(), page.click('#sign-in')]);
    await page.waitForSelector(row, { visible: true });
    await until((r) => {
      const c = document.querySelector(`${r} td.state`);
      return c && c.textContent.startsWith('running');
    }, row);
    await until((r) => Array.from(document.querySelectorAll(`${r} td.md`)).some((c) => c.textContent.includes('purpose=dashboard-firefox')), row);
    await shot('2-list');
    await width('list');
  });

  // The sandbox's page and its terminal: `echo hi` prints hi, and the
  // terminal fills its box (more than 80 columns at 1280 pixels).
  await step('open the sandbox page', async () => {
    await Promise.all([page.waitForNavigation(), page.click(`${row} a`)]);
    await page.waitForSelector('#open-terminal', { visible: true });
    await until(() => Array.from(document.querySelectorAll('#details dd')).some((d) => d.textContent.includes('purpose=dashboard-firefox')));
    await width('sandbox');
  });
  const lines = () => Array.from(document.querySelectorAll('.xterm-rows > div')).map((d) => d.textContent.trim());
  await step('open the terminal', async () => {
    await page.click('#open-terminal');
    await until(() => document.getElementById('term-status').textContent.startsWith('connected'));
    await page.waitForSelector('.xterm-helper-textarea');
    // The page gives the terminal the keyboard focus.
    await until(() => document.activeElement && document.activeElement.classList.contains('xterm-helper-textarea'));
    // The shell's prompt is up (typed ahead of it, the line would echo
    // twice: once by the terminal, once after the prompt).
    await until(() => Array.from(document.querySelectorAll('.xterm-rows > div')).some((d) => /[#$]$/.test(d.textContent.trim())));
    // The terminal stays inside its box, and xterm's empty legacy viewport
    // draws no native scrollbar (a light track on the black terminal).
    const bad = await page.evaluate(() => {
      const box = document.getElementById('terminal').getBoundingClientRect();
      const x = document.querySelector('#terminal .xterm').getBoundingClientRect();
      const v = document.querySelector('#terminal .xterm-viewport');
      const why = [];
      if (x.left < box.left || x.top < box.top || x.right > box.right + 0.5 || x.bottom > box.bottom + 0.5) {
        why.push(`the terminal ${JSON.stringify(x)} spills out of its box ${JSON.stringify(box)}`);
      }
      if (v.offsetWidth !== v.clientWidth) why.push(`xterm's viewport shows a ${v.offsetWidth - v.clientWidth}-pixel native scrollbar`);
      return why.join('; ');
    });
    if (bad) throw new Error(bad);
  });
  await step('type echo hi', async () => {
    await page.keyboard.type('echo hi');
    await page.keyboard.press('Enter');
    await until(() => Array.from(document.querySelectorAll('.xterm-rows > div')).some((d) => d.textContent.trim() === 'hi'));
    // Each key typed once: a doubled keystroke would echo "eecchhoo  hhii".
    const ls = await page.evaluate(lines);
    if (!ls.some((l) => l.endsWith('# echo hi')) || ls.some((l) => l.includes('eecchhoo'))) {
      throw new Error(`the command line is not "echo hi": ${JSON.stringify(ls)}`);
    }
    await shot('3-terminal');
  });
  await step('stty size', async () => {
    await page.keyboard.type('stty size');
    await page.keyboard.press('Enter');
    await until(() => Array.from(document.querySelectorAll('.xterm-rows > div')).some((d) => /^\d+ \d+$/.test(d.textContent.trim())));
    const size = (await page.evaluate(lines)).find((l) => /^\d+ \d+$/.test(l));
    const [rows, cols] = size.split(' ').map(Number);
    out.terminal = { rows, cols };
  });
  // Process audit: the programs the terminal ran are on the sandbox page's
  // live audit list (stty is a program; echo a shell builtin).
  await step('the audit shows the programs', async () => {
    await until(() => Array.from(document.querySelectorAll('#events li[data-action="proc.exec"]')).some((li) => li.textContent.includes('"stty"')));
  });
  await step('close the terminal', async () => {
    await page.click('#close-terminal');
    await page.waitForSelector('#open-terminal', { visible: true });
  });

  // The Server page: the tenant's own usage, the sandbox counted running.
  await step('the server page', async () => {
    await Promise.all([page.waitForNavigation(), page.click('#nav-server')]);
    await page.waitForSelector('#srv-h', { visible: true });
    await until(() => !!document.getElementById('server').dataset.loaded);
    await until(() => +(document.querySelector('#states li[data-state="running"] .n') || {}).textContent >= 1);
    await until(() => +document.querySelector('#activity svg').dataset.created >= 1);
    await until((t) => !!document.querySelector(`#tenants tr[data-tenant="${t}"] meter`), tenant);
    await shot('4-server');
    await width('server');
  });

  // Sign out: back to the sign-in page, and the session no longer reaches
  // the API.
  await step('sign out', async () => {
    await Promise.all([page.waitForNavigation(), page.click('#sign-out')]);
    await page.waitForSelector('#key', { visible: true });
    await shot('5-signed-out');
    watching = false;
    const status = await page.evaluate(() => fetch('/v1/sandboxes').then((r) => r.status));
    if (status !== 401) throw new Error(`/v1/sandboxes from the page after sign out: ${status}, want 401`);
  });
} catch (e) {
  if (!out.failed) out.failed = { step: '', error: String(e && e.stack ? e.stack : e), url: '', text: '' };
} finally {
  await browser.close().catch(() => {});
}
fs.writeSync(1, JSON.stringify(out) + '\n');
