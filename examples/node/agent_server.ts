#!/usr/bin/env node
// A calculator agent in TypeScript with the official `openai` npm package, serving grpo.agent.v1.AgentService
// so the trainer can train the policy it calls. The agent is a hand-written tool loop over chat completions
// with one function tool, `calculator(expression)`; only the base URL (RunEpisodeRequest.base_url) ties it to
// the trainer: the same loop runs against any OpenAI-compatible server.
//
//   npm ci                      # installs the packages and compiles this file to dist/agent_server.js
//   node dist/agent_server.js --port 50060 [--host 127.0.0.1] [--model policy] [--temperature 1]
//                             [--max-tokens 128] [--max-turns 4]
//
// Prints "listening on HOST:PORT" once serving (with --port 0, the port picked).

import path from 'node:path';
import { parseArgs } from 'node:util';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import OpenAI from 'openai';

import { fromStruct, toStruct } from './struct';

type ChatMessage = OpenAI.Chat.Completions.ChatCompletionMessageParam;
type JsonObject = Record<string, unknown>;

/** How the agent calls the model (the command line's options). */
interface Sampling {
  model: string;
  temperature: number;
  maxTokens: number;
  maxTurns: number;
}

/** RunEpisodeRequest as @grpc/proto-loader decodes it (keepCase, int64 as a string). */
interface RunEpisodeRequest {
  task?: unknown;
  base_url: string;
  deadline_unix_ms?: string;
  episode_id?: string;
}

interface RunEpisodeResponse {
  reward?: number;
  metadata: unknown;
}

const LOADER_OPTIONS = { keepCase: true, longs: String, enums: String, defaults: false, arrays: true, oneofs: true };
const MAX_EXPRESSION_CHARS = 200;
const MAX_MAGNITUDE = 1e15;

const CALCULATOR_TOOL: OpenAI.Chat.Completions.ChatCompletionTool = {
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
 */
export function evaluate(expression: string): number {
  if (expression.length > MAX_EXPRESSION_CHARS) throw new Error(`the expression is over ${MAX_EXPRESSION_CHARS} characters`);
  const tokens = expression.match(/\d+(?:\.\d+)?|[-+*/()]|\S/g) ?? [];
  let at = 0;
  const bounded = (value: number): number => {
    if (Math.abs(value) > MAX_MAGNITUDE) throw new Error(`a value beyond ${MAX_MAGNITUDE}`);
    return value;
  };
  const primary = (): number => {
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
  const product = (): number => {
    let value = primary();
    while (tokens[at] === '*' || tokens[at] === '/') {
      const op = tokens[at++];
      const right = primary();
      if (op === '/' && right === 0) throw new Error('division by zero');
      value = bounded(op === '*' ? value * right : value / right);
    }
    return value;
  };
  const sum = (): number => {
    let value = product();
    while (tokens[at] === '+' || tokens[at] === '-') value = bounded(tokens[at++] === '+' ? value + product() : value - product());
    return value;
  };
  const value = sum();
  if (at !== tokens.length) throw new Error(`unexpected '${tokens[at]}'`);
  return bounded(value);
}

/** The tool message's content for one call: the value, or "error: why" (a bad call is answered, never thrown). */
export function toolResult(name: string, argumentsJson: string): string {
  if (name !== 'calculator') return `error: unknown tool '${name}'; the tool is calculator`;
  try {
    const args: unknown = JSON.parse(argumentsJson || '{}');
    const expression = typeof args === 'object' && args !== null ? (args as JsonObject).expression : undefined;
    if (typeof expression !== 'string') return 'error: arguments must be {"expression": "..."}';
    const value = evaluate(expression);
    return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(6)));
  } catch (error) {
    return `error: ${error instanceof Error ? error.message : String(error)}`;
  }
}

/** The row's prompt as chat messages (a string prompt becomes one user message). */
function questionMessages(task: JsonObject): ChatMessage[] {
  if (typeof task.prompt === 'string') return [{ role: 'user', content: task.prompt }];
  if (!Array.isArray(task.prompt)) throw new Error('the task has no prompt');
  return task.prompt.map((m: JsonObject) => ({ role: String(m.role), content: String(m.content) }) as ChatMessage);
}

/** 1 when the answer's last number equals the row's answer, else 0; null when the row has none. */
function reward(answer: string, task: JsonObject): number | null {
  if (task.answer === undefined || task.answer === null || task.answer === '') return null;
  const numbers = answer.match(/-?\d+(?:\.\d+)?/g);
  return numbers && Number(numbers[numbers.length - 1]) === Number(task.answer) ? 1 : 0;
}

/** Plays one episode: the model answers the row's question, calling the calculator within maxTurns model calls. */
async function runEpisode(
  task: JsonObject,
  baseURL: string,
  deadlineMs: number,
  sampling: Sampling,
): Promise<{ reward: number | null; metadata: JsonObject }> {
  const timeout = deadlineMs > 0 ? Math.max(1, deadlineMs - Date.now()) : undefined;
  const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout });
  const messages = questionMessages(task);
  let answer = '';
  let toolCalls = 0;
  for (let turn = 0; turn < sampling.maxTurns; turn++) {
    const reply = await client.chat.completions.create({
      model: sampling.model,
      messages,
      tools: [CALCULATOR_TOOL],
      temperature: sampling.temperature,
      max_tokens: sampling.maxTokens,
    });
    const message = reply.choices[0].message;
    answer = message.content ?? '';
    const calls = (message.tool_calls ?? []).filter((call) => call.type === 'function');
    // The reply goes back as it came (same text, same calls): the gateway then reuses its tokens.
    messages.push(calls.length ? { role: 'assistant', content: message.content, tool_calls: calls } : { role: 'assistant', content: message.content });
    if (!calls.length) break;
    for (const call of calls) {
      toolCalls += 1;
      messages.push({ role: 'tool', tool_call_id: call.id, content: toolResult(call.function.name, call.function.arguments) });
    }
  }
  return { reward: reward(answer, task), metadata: { answer, tool_calls: toolCalls } };
}

/** RunEpisode: an agent failure becomes INTERNAL with its message, a missed deadline DEADLINE_EXCEEDED. */
function handlers(sampling: Sampling): grpc.UntypedServiceImplementation {
  const runEpisodeHandler: grpc.handleUnaryCall<RunEpisodeRequest, RunEpisodeResponse> = (call, callback) => {
    const request = call.request;
    const deadlineMs = Number(request.deadline_unix_ms ?? 0);
    if (deadlineMs > 0 && deadlineMs <= Date.now()) {
      callback({ code: grpc.status.DEADLINE_EXCEEDED, details: 'the episode did not end by its deadline' });
      return;
    }
    runEpisode(fromStruct(request.task) as JsonObject, request.base_url, deadlineMs, sampling).then(
      ({ reward: value, metadata }) => {
        const response: RunEpisodeResponse = { metadata: toStruct(metadata) };
        if (value !== null) response.reward = value;
        callback(null, response);
      },
      (error: unknown) => {
        const late = deadlineMs > 0 && Date.now() >= deadlineMs;
        const code = late ? grpc.status.DEADLINE_EXCEEDED : grpc.status.INTERNAL;
        const why = error instanceof Error ? error.message : String(error);
        callback({ code, details: `agent failed: ${why.slice(0, 1000)}` });
      },
    );
  };
  return { RunEpisode: runEpisodeHandler };
}

function main(argv: string[]): void {
  const { values } = parseArgs({
    args: argv,
    options: {
      host: { type: 'string', default: '127.0.0.1' },
      port: { type: 'string', default: '50060' },
      model: { type: 'string', default: 'policy' },
      temperature: { type: 'string', default: '1' },
      'max-tokens': { type: 'string', default: '128' },
      'max-turns': { type: 'string', default: '4' },
      // Compiled to dist/: the repository's protos are three directories up.
      protos: { type: 'string', default: path.join(__dirname, '..', '..', '..', 'protos') },
    },
  });
  const sampling: Sampling = {
    model: values.model,
    temperature: Number(values.temperature),
    maxTokens: Number(values['max-tokens']),
    maxTurns: Number(values['max-turns']),
  };
  const definition = protoLoader.loadSync('grpo/agent/v1/agent.proto', { ...LOADER_OPTIONS, includeDirs: [values.protos] });
  const loaded = grpc.loadPackageDefinition(definition) as unknown as {
    grpo: { agent: { v1: { AgentService: grpc.ServiceClientConstructor } } };
  };
  const server = new grpc.Server();
  server.addService(loaded.grpo.agent.v1.AgentService.service, handlers(sampling));
  server.bindAsync(`${values.host}:${values.port}`, grpc.ServerCredentials.createInsecure(), (error, port) => {
    if (error) {
      console.error(`cannot listen on ${values.host}:${values.port}: ${error.message}`);
      process.exit(1);
    }
    console.log(`listening on ${values.host}:${port}`);
  });
  const stop = (): void => server.tryShutdown(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

if (require.main === module) main(process.argv.slice(2));
