#!/usr/bin/env node
// A grpo.env.v1.EnvironmentService in Node.js: a number-guessing game with one tool, `guess(number)`.
// It shows what any language has to implement for the trio to train against its environment: five unary RPCs,
// tools described as JSON schema, tool calls answered as data (a bad call is an error *result* the model sees,
// never an RPC error), statuses that name the field for caller mistakes, and bounded resources.
//
//   npm ci
//   node env_server.js --port 50061 [--host 127.0.0.1] [--max-open 1024] [--idle-s 600]
//
// Prints "listening on HOST:PORT" once serving (with --port 0, the port picked).
'use strict';

const crypto = require('node:crypto');
const path = require('node:path');
const { parseArgs } = require('node:util');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const { toStruct, fromStruct } = require('./struct');

const LOADER_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: false, arrays: true, oneofs: true };
const ENVIRONMENT = 'guess-number';
const LOW = 1;
const HIGH = 100;
const MAX_CALLS_PER_STEP = 32;
const MAX_ARGUMENTS_CHARS = 10000;

const GUESS_TOOL = {
  name: 'guess',
  description: `Guess the secret integer between ${LOW} and ${HIGH}. Answers "higher", "lower" or "correct".`,
  parameters: {
    type: 'object',
    properties: { number: { type: 'integer', description: `Your guess, ${LOW} to ${HIGH}.` } },
    required: ['number'],
  },
};

/** A status error for the callback: gRPC code plus "field: message" details, as the Python services send. */
function status(code, message, field) {
  return { code, details: field ? `${field}: ${message}` : message };
}

/** One game: the secret, the guesses so far, solved or not. */
class Game {
  constructor(secret) {
    this.secret = secret;
    this.guesses = 0;
    this.solved = false;
    this.lastUsed = Date.now();
  }

  /** The tool message for one call; throws an Error whose message the model sees as an error result. */
  call(name, argumentsJson) {
    if (this.solved) throw new Error('the game is over: the number was found');
    if (name !== GUESS_TOOL.name) throw new Error(`unknown tool '${name}'; the tools are: ${GUESS_TOOL.name}`);
    if (argumentsJson.length > MAX_ARGUMENTS_CHARS) {
      throw new Error(`arguments are ${argumentsJson.length} characters, at most ${MAX_ARGUMENTS_CHARS}`);
    }
    let args;
    try {
      args = JSON.parse(argumentsJson.trim() || '{}');
    } catch (error) {
      throw new Error(`arguments are not valid JSON: ${error.message}`);
    }
    if (args === null || typeof args !== 'object' || Array.isArray(args)) {
      throw new Error('arguments must be a JSON object');
    }
    if (!Number.isInteger(args.number)) throw new Error('invalid arguments at number: must be an integer');
    this.guesses += 1;
    if (args.number < this.secret) return 'higher';
    if (args.number > this.secret) return 'lower';
    this.solved = true;
    return `correct! found in ${this.guesses} guesses`;
  }

  /** 1 when solved, less the more guesses it took (0.1 per guess after the first), 0 when not solved. */
  reward() {
    return this.solved ? Math.max(0.1, 1 - 0.1 * (this.guesses - 1)) : 0;
  }
}

class GuessNumberService {
  constructor(maxOpen, idleMs) {
    this.games = new Map();
    this.maxOpen = maxOpen;
    this.idleMs = idleMs;
    this.sweeper = setInterval(() => this.expire(), Math.min(30000, idleMs / 4));
    this.sweeper.unref();
  }

  expire() {
    const deadline = Date.now() - this.idleMs;
    for (const [id, game] of this.games) if (game.lastUsed < deadline) this.games.delete(id);
  }

  game(episodeId) {
    const game = this.games.get(episodeId);
    if (!game) throw status(grpc.status.NOT_FOUND, `no open episode '${String(episodeId).slice(0, 64)}'`, 'episode_id');
    game.lastUsed = Date.now();
    return game;
  }

  handlers() {
    // Every handler answers through one wrapper, so a thrown status (or a bug) always reaches the caller.
    const unary = (fn) => (callObj, callback) => {
      try {
        callback(null, fn(callObj.request));
      } catch (error) {
        callback(error.code !== undefined ? error : status(grpc.status.INTERNAL, String(error)));
      }
    };
    return {
      ListEnvironments: unary(() => ({
        environments: [
          {
            name: ENVIRONMENT,
            description: `Guess a number between ${LOW} and ${HIGH} (Node.js example server).`,
            kind: 'node',
            available: true,
            status: `${this.games.size} episodes open`,
          },
        ],
      })),
      OpenEpisode: unary((request) => {
        if (request.environment !== ENVIRONMENT) {
          const name = request.environment || '';
          throw status(grpc.status.INVALID_ARGUMENT, `unknown environment '${name}'`, 'environment');
        }
        const params = fromStruct(request.params);
        const extra = Object.keys(params)[0];
        if (extra !== undefined) throw status(grpc.status.INVALID_ARGUMENT, 'unknown parameter', `params.${extra}`);
        const metadata = fromStruct(request.metadata);
        let secret = metadata.secret;
        if (secret === undefined || secret === null) secret = crypto.randomInt(LOW, HIGH + 1);
        if (!Number.isInteger(secret) || secret < LOW || secret > HIGH) {
          throw status(grpc.status.INVALID_ARGUMENT, `must be an integer from ${LOW} to ${HIGH}`, 'metadata.secret');
        }
        if (this.games.size >= this.maxOpen) {
          throw status(grpc.status.RESOURCE_EXHAUSTED, `${this.maxOpen} episodes are open; close finished ones`);
        }
        const episodeId = crypto.randomBytes(16).toString('base64url');
        this.games.set(episodeId, new Game(secret));
        return {
          episode_id: episodeId,
          tools: [{ ...GUESS_TOOL, parameters: toStruct(GUESS_TOOL.parameters) }],
          prompt_suffix: `\nI am thinking of a number between ${LOW} and ${HIGH}. Find it with the guess tool.`,
        };
      }),
      Step: unary((request) => {
        const game = this.game(request.episode_id);
        const calls = request.calls || [];
        if (calls.length === 0) {
          throw status(grpc.status.INVALID_ARGUMENT, 'at least one tool call is required', 'calls');
        }
        if (calls.length > MAX_CALLS_PER_STEP) {
          const message = `${calls.length} tool calls, at most ${MAX_CALLS_PER_STEP}`;
          throw status(grpc.status.RESOURCE_EXHAUSTED, message, 'calls');
        }
        const results = calls.map((c) => {
          const base = { call_id: c.id || '', name: c.name || '' };
          try {
            return { ...base, content: game.call(c.name || '', c.arguments_json || '') };
          } catch (error) {
            return { ...base, content: error.message, error: true };
          }
        });
        return { results, done: game.solved };
      }),
      GetReward: unary((request) => ({ reward: this.game(request.episode_id).reward() })),
      CloseEpisode: unary((request) => ({ closed: this.games.delete(request.episode_id) })),
    };
  }
}

function main(argv) {
  const { values: options } = parseArgs({
    args: argv,
    options: {
      host: { type: 'string', default: '127.0.0.1' },
      port: { type: 'string', default: '50061' },
      'max-open': { type: 'string', default: '1024' },
      'idle-s': { type: 'string', default: '600' },
      protos: { type: 'string', default: path.join(__dirname, '..', '..', 'protos') },
    },
  });
  const definition = protoLoader.loadSync('grpo/env/v1/env.proto', {
    ...LOADER_OPTIONS,
    includeDirs: [options.protos],
  });
  const envV1 = grpc.loadPackageDefinition(definition).grpo.env.v1;
  const service = new GuessNumberService(Number(options['max-open']), Number(options['idle-s']) * 1000);
  const server = new grpc.Server();
  server.addService(envV1.EnvironmentService.service, service.handlers());
  server.bindAsync(`${options.host}:${options.port}`, grpc.ServerCredentials.createInsecure(), (error, port) => {
    if (error) {
      console.error(`cannot listen on ${options.host}:${options.port}: ${error.message}`);
      process.exit(1);
    }
    console.log(`listening on ${options.host}:${port}`);
  });
  const stop = () => server.tryShutdown(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main(process.argv.slice(2));
