// The demo's view of the queue, through the official AWS SDK for JavaScript (installed with
// fauxqs in .tools/node_modules): create the queue, then read back what the relay sent.
//
// Usage: node scripts/demo-sqs.mjs create ENDPOINT NAME
//        node scripts/demo-sqs.mjs receive ENDPOINT QUEUE_URL EXPECTED
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import path from "node:path";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(path.join(root, ".tools", "package.json"));
const { SQSClient, CreateQueueCommand, ReceiveMessageCommand, DeleteMessageBatchCommand } =
  require("@aws-sdk/client-sqs");

const [command, endpoint, arg, expected] = process.argv.slice(2);
const sqs = new SQSClient({
  endpoint,
  region: "us-east-1",
  credentials: { accessKeyId: "demo", secretAccessKey: "demo" },
});

if (command === "create") {
  const out = await sqs.send(new CreateQueueCommand({ QueueName: arg }));
  console.log(out.QueueUrl);
} else if (command === "receive") {
  const want = Number(expected);
  const rows = [];
  for (let empty = 0; rows.length < want || empty < 2; ) {
    const out = await sqs.send(new ReceiveMessageCommand({
      QueueUrl: arg, MaxNumberOfMessages: 10, MessageAttributeNames: ["All"], WaitTimeSeconds: 1,
    }));
    const got = out.Messages ?? [];
    if (got.length === 0) { empty++; if (empty > 10) break; continue; }
    empty = 0;
    for (const m of got) {
      const a = m.MessageAttributes ?? {};
      rows.push({
        event_id: a.event_id?.StringValue,
        event_type: a.event_type?.StringValue,
        aggregate: `${a.aggregate_type?.StringValue}/${a.aggregate_id?.StringValue}`,
        traceparent: a.traceparent?.StringValue ?? "",
        body: m.Body.length > 60 ? m.Body.slice(0, 57) + "..." : m.Body,
      });
    }
    await sqs.send(new DeleteMessageBatchCommand({
      QueueUrl: arg,
      Entries: got.map((m, i) => ({ Id: String(i), ReceiptHandle: m.ReceiptHandle })),
    }));
  }
  rows.sort((x, y) => x.event_id.localeCompare(y.event_id, undefined, { numeric: true }));
  console.table(rows);
  console.log(`${rows.length} messages received (expected ${want})`);
} else {
  console.error("usage: demo-sqs.mjs create ENDPOINT NAME | receive ENDPOINT QUEUE_URL EXPECTED");
  process.exit(2);
}
