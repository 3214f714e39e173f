// Starts fauxqs for the integration tests on 127.0.0.1 only, on a port the OS picks.
//
// Usage: node fauxqs.mjs /abs/path/to/.tools/node_modules/fauxqs/dist/app.js
//
// The module path is an argument because ESM ignores NODE_PATH, and this file lives outside
// .tools/. `startFauxqs()` is deliberately not used: it listens on 0.0.0.0.
import { pathToFileURL } from "node:url";

const entry = process.argv[2];
if (!entry) {
  console.error("usage: node fauxqs.mjs <path to fauxqs/dist/app.js>");
  process.exit(2);
}
const { buildApp } = await import(pathToFileURL(entry).href);
const app = buildApp({ logger: false });
const addr = await app.listen({ port: 0, host: "127.0.0.1" });
// The test harness reads this exact line to learn the port.
console.log(`LISTENING ${addr}`);
