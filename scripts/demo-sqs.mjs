// The demo's view of the local AWS services, through the official AWS SDK for JavaScript
// (installed with fauxqs in .tools/node_modules): create the queue, the bucket large events go
// to and a topic with subscribed queues, then read back what the relay sent.
//
// Usage: node scripts/demo-sqs.mjs create ENDPOINT NAME
//        node scripts/demo-sqs.mjs bucket ENDPOINT NAME
//        node scripts/demo-sqs.mjs topic ENDPOINT NAME QUEUE_URL...   (raw message delivery)
//        node scripts/demo-sqs.mjs receive ENDPOINT QUEUE_URL EXPECTED
//        node scripts/demo-sqs.mjs objects ENDPOINT BUCKET
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import path from "node:path";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(path.join(root, ".tools", "package.json"));
const {
  SQSClient, CreateQueueCommand, GetQueueAttributesCommand, ReceiveMessageCommand,
  DeleteMessageBatchCommand,
} = require("@aws-sdk/client-sqs");
const { S3Client, CreateBucketCommand, ListObjectsV2Command } = require("@aws-sdk/client-s3");
const { SNSClient, CreateTopicCommand, SubscribeCommand } = require("@aws-sdk/client-sns");

const [command, endpoint, arg, expected, ...more] = process.argv.slice(2);
const settings = {
  endpoint,
  region: "us-east-1",
  credentials: { accessKeyId: "demo", secretAccessKey: "demo" },
};
const sqs = new SQSClient(settings);

if (command === "create") {
  const out = await sqs.send(new CreateQueueCommand({ QueueName: arg }));
  console.log(out.QueueUrl);
} else if (command === "bucket") {
  // Path-style: a local server has no per-bucket host names.
  await new S3Client({ ...settings, forcePathStyle: true }).send(new CreateBucketCommand({ Bucket: arg }));
  console.log(arg);
} else if (command === "objects") {
  const s3 = new S3Client({ ...settings, forcePathStyle: true });
  const out = await s3.send(new ListObjectsV2Command({ Bucket: arg }));
  console.table((out.Contents ?? []).map((o) => ({ key: o.Key, bytes: o.Size })));
} else if (command === "topic") {
  const sns = new SNSClient(settings);
  const topic = await sns.send(new CreateTopicCommand({ Name: arg }));
  for (const queueUrl of [expected, ...more]) {
    const attrs = await sqs.send(new GetQueueAttributesCommand({
      QueueUrl: queueUrl, AttributeNames: ["QueueArn"],
    }));
    await sns.send(new SubscribeCommand({
      TopicArn: topic.TopicArn, Protocol: "sqs", Endpoint: attrs.Attributes.QueueArn,
      Attributes: { RawMessageDelivery: "true" },
    }));
  }
  console.log(topic.TopicArn);
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
        // Set when the body went to S3 and the message is the Extended Client's pointer.
        s3_payload_bytes: a.ExtendedPayloadSize?.StringValue ?? "",
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
  console.error("usage: demo-sqs.mjs create|bucket ENDPOINT NAME | topic ENDPOINT NAME QUEUE_URL... | receive ENDPOINT QUEUE_URL EXPECTED | objects ENDPOINT BUCKET");
  process.exit(2);
}
