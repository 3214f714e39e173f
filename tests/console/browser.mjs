// A real browser for the console's tests (tests/console.rs): Debian's Chromium, headless,
// driven with playwright-core from .tools. The test sends one JSON command per line on stdin
// and reads one JSON answer per line on stdout, so the story's steps and assertions stay in
// the Rust test, between which it changes the world (creates a queue, reads SQS).
//
// Commands: {op: "goto", url} | {op: "fill", selector, value} | {op: "click", selector}
// | {op: "texts", selector} | {op: "html"} | {op: "shot", path} | {op: "pwned"} | {op: "url"}
// | {op: "close"}. Every answer has `ok`; a failed command answers {ok: false, error}.
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import path from "node:path";
import readline from "node:readline";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(path.join(root, ".tools", "package.json"));
const { chromium } = require("playwright-core");

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  // Root in CI has no user namespace for the sandbox; the closed network refuses Chromium's
  // own background connections, so they are turned off rather than left failing.
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
// Anything that tries to run in the page is counted: a dialog, or a CSP violation.
let dialogs = 0;
let violations = 0;
page.on("dialog", (d) => {
  dialogs += 1;
  d.dismiss().catch(() => {});
});
page.on("console", (m) => {
  if (m.type() === "error" && /Content Security Policy/i.test(m.text())) violations += 1;
});

async function run(cmd) {
  switch (cmd.op) {
    case "goto": {
      const response = await page.goto(cmd.url, { waitUntil: "load" });
      return { status: response ? response.status() : 0 };
    }
    case "fill":
      await page.fill(cmd.selector, cmd.value);
      return {};
    case "click": {
      // A submit navigates: wait for the page it loads, not a guess of how long it takes.
      await Promise.all([
        page.waitForNavigation({ waitUntil: "load" }).catch(() => {}),
        page.click(cmd.selector),
      ]);
      return { url: page.url() };
    }
    case "texts":
      return { texts: await page.locator(cmd.selector).allInnerTexts() };
    case "html":
      return { html: await page.content() };
    case "shot":
      await page.screenshot({ path: cmd.path, fullPage: true });
      return {};
    case "pwned":
      return {
        pwned: await page.evaluate(() => window.__pwned === 1),
        dialogs,
        violations,
      };
    case "url":
      return { url: page.url() };
    case "close":
      await browser.close();
      return {};
    default:
      throw new Error(`unknown op ${cmd.op}`);
  }
}

const lines = readline.createInterface({ input: process.stdin });
process.stdout.write(JSON.stringify({ ok: true, ready: true }) + "\n");
for await (const line of lines) {
  if (!line.trim()) continue;
  let answer;
  try {
    const cmd = JSON.parse(line);
    answer = { ok: true, ...(await run(cmd)) };
    if (cmd.op === "close") {
      process.stdout.write(JSON.stringify(answer) + "\n");
      break;
    }
  } catch (e) {
    answer = { ok: false, error: String(e && e.message ? e.message : e) };
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
}
process.exit(0);
