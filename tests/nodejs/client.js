'use strict';
/*
 * Runs the official RocketMQ 5 Node.js client (rocketmq-client-nodejs, see package.json) for
 * tests/test_nodejs_client.py, step by step.
 *
 * stdin: {"endpoint": "127.0.0.1:8081", "tls": false, "ak": "...", "sk": "...", "steps": [...]}, each step one of
 *   {"op": "send", "topic": "T", "messages": [{"body": "...", "tag": "...", "keys": [...]}]}: a Producer sends them
 *       in order; its result is the list of {"message_id"};
 *   {"op": "receive", "group": "G", "topic": "T", "expression": "*", "until": 3, "invisible_s": 30,
 *       "timeout_s": 20, "ack": true}: a SimpleConsumer receives until "until" messages came (or timeout_s passed),
 *       acknowledging each when "ack"; its result is the list of {"message_id", "topic", "body", "tag", "keys",
 *       "attempt"}.
 * A step that fails answers {"error": "<exception class>: <message>", "code": <v2 status code or null>,
 * "logged": [the client's error log lines meanwhile]} and the next step runs. With "tls": true the client dials TLS (its sslEnabled), trusting Node's roots and the
 * certificates NODE_EXTRA_CA_CERTS names. "ak"/"sk" are its sessionCredentials.
 * stdout: one JSON line, one result per step. The client's log goes to stderr.
 */
const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

// The client logs the cause of a failed startup (e.g. the gateway's answer to each route lookup) and throws a
// summary: a failed step reports the errors logged while it ran as well.
let logged = [];
const logger = {
  info: (...args) => console.error('INFO', ...args),
  warn: (...args) => console.error('WARN', ...args),
  error: (...args) => {
    console.error('ERROR', ...args);
    logged.push(args.map(String).join(' '));
  },
  debug: () => {},
};

function options(spec) {
  const o = { endpoints: spec.endpoint, sslEnabled: Boolean(spec.tls), requestTimeout: 10000, logger };
  if (spec.ak) {
    o.sessionCredentials = { accessKey: spec.ak, accessSecret: spec.sk };
  }
  return o;
}

async function send(spec, step) {
  const producer = new Producer({ ...options(spec), topic: step.topic, maxAttempts: 1 });
  await producer.startup();
  try {
    const receipts = [];
    for (const m of step.messages) {
      const receipt = await producer.send({
        topic: step.topic, body: Buffer.from(m.body), tag: m.tag, keys: m.keys || [],
      });
      receipts.push({ message_id: receipt.messageId });
    }
    return receipts;
  } finally {
    await producer.shutdown();
  }
}

async function receive(spec, step) {
  const consumer = new SimpleConsumer({
    ...options(spec), consumerGroup: step.group, awaitDuration: 2000,
    subscriptions: new Map().set(step.topic, step.expression || '*'),
  });
  await consumer.startup();
  try {
    const got = [];
    const deadline = Date.now() + (step.timeout_s || 20) * 1000;
    while (got.length < (step.until || 1) && Date.now() < deadline) {
      for (const v of await consumer.receive(16, (step.invisible_s || 30) * 1000)) {
        got.push({ message_id: v.messageId, topic: v.topic, body: v.body.toString(), tag: v.tag ?? null,
          keys: v.keys, attempt: v.deliveryAttempt });
        if (step.ack) {
          await consumer.ack(v);
        }
      }
    }
    return got;
  } finally {
    await consumer.shutdown();
  }
}

const OPS = { send, receive };

async function main() {
  let text = '';
  for await (const chunk of process.stdin) {
    text += chunk;
  }
  const spec = JSON.parse(text);
  const results = [];
  for (const step of spec.steps) {
    const op = OPS[step.op];
    if (!op) {
      throw new Error(`unknown step ${step.op}`);
    }
    logged = [];
    try {
      results.push(await op(spec, step));
    } catch (e) {
      results.push({ error: `${e.name}: ${e.message}`, code: typeof e.code === 'number' ? e.code : null, logged });
    }
  }
  process.stdout.write(JSON.stringify(results) + '\n');
}

main().then(() => process.exit(0), e => {
  console.error(e);
  process.exit(1);
});
