#!/usr/bin/env node
// A calculator agent in Node.js with the official `openai` npm package, serving grpo.agent.v1.AgentService so
// the trainer can train the policy it calls. The agent is a hand-written tool loop over chat completions with
// one function tool, `calculator(expression)`; only the base URL (RunEpisodeRequest.base_url) ties it to the
// trainer: the same loop runs against any OpenAI-compatible server.
//
//   npm ci
//   node agent_server.js --port 50060 [--host 127.0.0.1] [--model policy] [--temperature 1]
//                        [--max-tokens 128] [--max-turns 4]
//
// Prints "listening on HOST:PORT" once serving (with --port 0, the port picked).
'use strict';

const path = require('node:path');
const { parseArgs } = require('node:util');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { OpenAI } = require('openai');

const { toStruct, fromStruct } = require('./struct');

const LOADER_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: false, arrays: true, oneofs: true };
const MAX_EXPRESSION_CHARS = 200;
const MAX_MAGNITUDE = 1e15;

const CALCULATOR_TOOL = {
  type: 'function',
  function: {
    name: 'calculator',
    description: 'Evaluates an arithmetic expression of numbers, + - * / and parentheses.',
    parameters: {
      type: 'object',
      properties: { expression: { type: 'string', description: 'For example 347 + 582.' } },
      required: ['expression'],
      additionalProperties: false,
    },
  },
};

/**
 * The value of an arithmetic expression (numbers, + - * /, unary minus, parentheses) by recursive descent;
 * throws an Error for anything else, a division by zero or a value beyond MAX_MAGNITUDE. Never calls eval.
 * @param {string} expression
 * @returns {number}
 */
function evaluate(expression) {
  if (expression.length > MAX_EXPRESSION_CHARS) throw new Error(`the expression is over ${MAX_EXPRESSION_CHARS} characters`);
  const tokens = expression.match(/\d+(?:\.\d+)?|[-+*/()]|\S/g) || [];
  let at = 0;
  const bounded = (value) => {
    if (Math.abs(value) > MAX_MAGNITUDE) throw new Error(`a value beyond ${MAX_MAGNITUDE}`);
    return value;
  };
  const primary = () => {
    const token = tokens[at++];
    if (token === '-') return -primary();
    if (token === '+') return primary();
    if (token === '(') {
      const value = sum();
      if (tokens[at++] !== ')') throw new Error('a parenthesis is not closed');
      return value;
    }
    if (token !== undefined && /^\d/.test(token)) return Number(token);
    throw new Error(`unexpected ${token === undefined ? 'end' : `'${token}'`}: use numbers, + - * / and parentheses`);
  };
  const product = () => {
    let value = primary();
    while (tokens[at] === '*' || tokens[at] === '/') {
      const op = tokens[at++];
      const right = primary();
      if (op === '/' && right === 0) throw new Error('division by zero');
      value = bounded(op === '*' ? value * right : value / right);
    }
    return value;
  };
  const sum = () => {
    let value = product();
    while (tokens[at] === '+' || tokens[at] === '-') value = bounded(tokens[at++] === '+' ? value + product() : value - product());
    return value;
  };
  const value = sum();
  if (at !== tokens.length) throw new Error(`unexpected '${tokens[at]}'`);
  return bounded(value);
}

/** The tool message's content for one call: the value, or "error: why" (a bad call is answered, never thrown). */
function toolResult(name, argumentsJson) {
  if (name !== 'calculator') return `error: unknown tool '${name}'; the tool is calculator`;
  try {
    const args = JSON.parse(argumentsJson || '{}');
    if (args === null || typeof args.expression !== 'string') return 'error: arguments must be {"expression": "..."}';
    const value = evaluate(args.expression);
    return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(6)));
  } catch (error) {
    return `error: ${error.message}`;
  }
}

/** The row's prompt as chat messages (a string prompt becomes one user message). */
function questionMessages(task) {
  if (typeof task.prompt === 'string') return [{ role: 'user', content: task.prompt }];
  return task.prompt.map((m) => ({ role: String(m.role), content: String(m.content) }));
}

/** 1 when the answer's last number equals the row's answer, else 0; null when the row has none. */
function reward(answer, task) {
  if (task.answer === undefined || task.answer === null || task.answer === '') return null;
  const numbers = answer.match(/-?\d+(?:\.\d+)?/g);
  return numbers && Number(numbers[numbers.length - 1]) === Number(task.answer) ? 1 : 0;
}

/**
 * Plays one episode: the model answers the row's question, calling the calculator within maxTurns model calls.
 * @returns {Promise<{reward: number|null, metadata: object}>}
 */
async function runEpisode(task, baseURL, deadlineMs, options) {
  const timeout = deadlineMs > 0 ? Math.max(1, deadlineMs - Date.now()) : undefined;
  const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout });
  const messages = questionMessages(task);
  let message;
  let toolCalls = 0;
  for (let turn = 0; turn < options.maxTurns; turn++) {
    const reply = await client.chat.completions.create({
      model: options.model,
      messages,
      tools: [CALCULATOR_TOOL],
      temperature: options.temperature,
      max_tokens: options.maxTokens,
    });
    message = reply.choices[0].message;
    // The reply goes back as it came (same text, same calls): the gateway then reuses its tokens.
    const sentBack = { role: 'assistant', content: message.content };
    if (message.tool_calls && message.tool_calls.length) sentBack.tool_calls = message.tool_calls;
    messages.push(sentBack);
    if (!sentBack.tool_calls) break;
    for (const call of message.tool_calls) {
      toolCalls += 1;
      messages.push({ role: 'tool', tool_call_id: call.id, content: toolResult(call.function.name, call.function.arguments) });
    }
  }
  const answer = message.content || '';
  return { reward: reward(answer, task), metadata: { answer, tool_calls: toolCalls } };
}

/** RunEpisode: an agent failure becomes INTERNAL with its message, a missed deadline DEADLINE_EXCEEDED. */
function handlers(options) {
  return {
    RunEpisode: (callObj, callback) => {
      const request = callObj.request;
      const deadlineMs = Number(request.deadline_unix_ms || 0);
      if (deadlineMs > 0 && deadlineMs <= Date.now()) {
        callback({ code: grpc.status.DEADLINE_EXCEEDED, details: 'the episode did not end by its deadline' });
        return;
      }
      runEpisode(fromStruct(request.task), request.base_url, deadlineMs, options).then(
        ({ reward: value, metadata }) => {
          const response = { metadata: toStruct(metadata) };
          if (value !== null) response.reward = value;
          callback(null, response);
        },
        (error) => {
          const late = deadlineMs > 0 && Date.now() >= deadlineMs;
          const code = late ? grpc.status.DEADLINE_EXCEEDED : grpc.status.INTERNAL;
          callback({ code, details: `agent failed: ${String(error && error.message ? error.message : error).slice(0, 1000)}` });
        },
      );
    },
  };
}

function main(argv) {
  const { values } = parseArgs({
    args: argv,
    options: {
      host: { type: 'string', default: '127.0.0.1' },
      port: { type: 'string', default: '50060' },
      model: { type: 'string', default: 'policy' },
      temperature: { type: 'string', default: '1' },
      'max-tokens': { type: 'string', default: '128' },
      'max-turns': { type: 'string', default: '4' },
      protos: { type: 'string', default: path.join(__dirname, '..', '..', 'protos') },
    },
  });
  const options = {
    model: values.model,
    temperature: Number(values.temperature),
    maxTokens: Number(values['max-tokens']),
    maxTurns: Number(values['max-turns']),
  };
  const definition = protoLoader.loadSync('grpo/agent/v1/agent.proto', { ...LOADER_OPTIONS, includeDirs: [values.protos] });
  const agentV1 = grpc.loadPackageDefinition(definition).grpo.agent.v1;
  const server = new grpc.Server();
  server.addService(agentV1.AgentService.service, handlers(options));
  server.bindAsync(`${values.host}:${values.port}`, grpc.ServerCredentials.createInsecure(), (error, port) => {
    if (error) {
      console.error(`cannot listen on ${values.host}:${values.port}: ${error.message}`);
      process.exit(1);
    }
    console.log(`listening on ${values.host}:${port}`);
  });
  const stop = () => server.tryShutdown(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

if (require.main === module) main(process.argv.slice(2));

module.exports = { evaluate, toolResult };
