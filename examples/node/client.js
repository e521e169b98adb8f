#!/usr/bin/env node
// Calls grpo.reward.v1.RewardService from Node.js: ListRewards, then Score with per-sample metadata, weighted
// reward specs and (optionally) a loaded process reward model. The .proto files are loaded at run time with
// @grpc/proto-loader, so nothing is generated. Prints one JSON object on stdout.
//
//   npm ci
//   node client.js --target 127.0.0.1:50051 [--prm NAME] [--token TOKEN] [--samples FILE.json]
//
// Exit status: 0 on success, 1 on an RPC error (its gRPC status name and message go to stderr), 2 on bad usage.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require('node:util');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const { toStruct, fromValue } = require('./struct');

const USAGE = `usage: node client.js [options]
  --target HOST:PORT    reward service address (default 127.0.0.1:50051; any gRPC target, e.g. dns:///reward:50051)
  --prm NAME            also score with the loaded process reward model prm:NAME (weight 1.0)
  --token TOKEN         admin bearer token sent as 'authorization' metadata (default: env GRPO_ADMIN_TOKEN)
  --samples FILE        JSON list of samples ({id, prompt, completion, metadata, group}); default: two examples
  --request-id ID       value of the 'x-request-id' call metadata (default: a random one)
  --deadline-ms MS      deadline of each call (default 30000)
  --ca FILE             PEM CA bundle: connect with TLS (default: plaintext)
  --protos DIR          root of the .proto files (default: ../../protos next to this file)
  -h, --help            this text`;

// Loader options: field names as in the .proto (snake_case), 64-bit integers as strings, enums by name,
// unset fields left out (so "no value" stays distinguishable from 0), repeated fields always present.
const LOADER_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: false, arrays: true, oneofs: true };

// Two GSM8K-style samples: one correct and well formatted, one wrong. `metadata.answer` is the gold answer that
// the `accuracy` reward reads (any dataset column can travel in metadata).
const DEFAULT_SAMPLES = [
  {
    id: 'correct',
    group: 'q1',
    prompt: [{ role: 'user', content: 'What is 6 times 7?' }],
    completion: '<think>\n6 times 7 is 42.\n</think>\n<answer>\n\\boxed{42}\n</answer>',
    metadata: { answer: '42' },
  },
  {
    id: 'wrong',
    group: 'q1',
    prompt: [{ role: 'user', content: 'What is 6 times 7?' }],
    completion: 'I think it is \\boxed{41}.',
    metadata: { answer: '42' },
  },
];

function loadRewardService(protoRoot) {
  // Well-known imports (google/protobuf/struct.proto, timestamp.proto, descriptor.proto) resolve to the copies
  // bundled with protobufjs; the project's own imports (grpo/common/v1/common.proto) resolve under protoRoot.
  const definition = protoLoader.loadSync('grpo/reward/v1/reward.proto', {
    ...LOADER_OPTIONS,
    includeDirs: [protoRoot],
  });
  return grpc.loadPackageDefinition(definition).grpo.reward.v1;
}

/** Promise wrapper of a unary call with metadata and a deadline. */
function call(client, method, request, metadata, deadlineMs) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + deadlineMs);
    client[method](request, metadata, { deadline }, (error, response) => (error ? reject(error) : resolve(response)));
  });
}

function scoreRequest(samples, prmName) {
  const rewards = [
    { name: 'accuracy', weight: 1.0 },
    { name: 'format', weight: 0.5 },
  ];
  if (prmName) {
    // PRM step scores are aggregated into one value; `aggregate` is one of the reward's params (ListRewards).
    rewards.push({ name: `prm:${prmName}`, weight: 1.0, params: toStruct({ aggregate: 'min' }) });
  }
  return {
    samples: samples.map((s) => ({
      id: s.id || '',
      group: s.group || '',
      prompt: s.prompt || [],
      completion: s.completion,
      completion_ids: s.completion_ids || [],
      metadata: toStruct(s.metadata),
    })),
    rewards,
  };
}

function describeReward(info) {
  return {
    name: info.name,
    description: info.description || '',
    params: info.params.map((p) => ({ name: p.name, type: p.type, default: fromValue(p.default_value) })),
    required_metadata: info.required_metadata,
    available: Boolean(info.available),
    status: info.status || '',
  };
}

function describeScore(score) {
  return {
    id: score.id || '',
    // Unset (no component produced a value) is null, as TRL's None.
    reward: score.reward === undefined ? null : score.reward,
    components: score.components.map((c) => ({
      name: c.name,
      value: c.value === undefined ? null : c.value,
      step_scores: c.step_scores,
      error: c.error || '',
    })),
  };
}

async function main(argv) {
  let options;
  try {
    ({ values: options } = parseArgs({
      args: argv,
      options: {
        target: { type: 'string', default: '127.0.0.1:50051' },
        prm: { type: 'string' },
        token: { type: 'string' },
        samples: { type: 'string' },
        'request-id': { type: 'string' },
        'deadline-ms': { type: 'string', default: '30000' },
        ca: { type: 'string' },
        protos: { type: 'string', default: path.join(__dirname, '..', '..', 'protos') },
        help: { type: 'boolean', short: 'h', default: false },
      },
    }));
  } catch (error) {
    console.error(`${error.message}\n${USAGE}`);
    return 2;
  }
  if (options.help) {
    console.log(USAGE);
    return 0;
  }
  const deadlineMs = Number(options['deadline-ms']);
  if (!Number.isFinite(deadlineMs) || deadlineMs <= 0) {
    console.error(`--deadline-ms must be a positive number\n${USAGE}`);
    return 2;
  }
  const samples = options.samples ? JSON.parse(fs.readFileSync(options.samples, 'utf8')) : DEFAULT_SAMPLES;

  const rewardV1 = loadRewardService(options.protos);
  const credentials = options.ca
    ? grpc.credentials.createSsl(fs.readFileSync(options.ca))
    : grpc.credentials.createInsecure();
  const client = new rewardV1.RewardService(options.target, credentials, {
    // Same limits as the servers (server.max_message_bytes, 64 MiB by default); gRPC's default receive limit is 4 MiB.
    'grpc.max_receive_message_length': 64 * 1024 * 1024,
    'grpc.max_send_message_length': 64 * 1024 * 1024,
  });

  // Call metadata: a request id for the server's logs and, when given, the admin token. Score and ListRewards
  // are public; the token only matters for RewardAdminService, and public RPCs ignore it.
  const metadata = new grpc.Metadata();
  metadata.set('x-request-id', options['request-id'] || `node-${process.pid}-${Date.now()}`);
  const token = options.token || process.env.GRPO_ADMIN_TOKEN;
  if (token) metadata.set('authorization', `Bearer ${token}`);

  try {
    const listed = await call(client, 'ListRewards', {}, metadata, deadlineMs);
    const scored = await call(client, 'Score', scoreRequest(samples, options.prm), metadata, deadlineMs);
    const result = {
      target: options.target,
      rewards: listed.rewards.map(describeReward),
      scores: scored.scores.map(describeScore),
    };
    process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    return 0;
  } catch (error) {
    // Retry only UNAVAILABLE and RESOURCE_EXHAUSTED (with backoff); INVALID_ARGUMENT means the request is wrong.
    const codeName = Object.keys(grpc.status).find((name) => grpc.status[name] === error.code) || String(error.code);
    console.error(`${codeName}: ${error.details || error.message}`);
    return 1;
  } finally {
    client.close();
  }
}

main(process.argv.slice(2)).then((code) => {
  process.exitCode = code;
});
