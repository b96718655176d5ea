// Drives the gateway with the official openai npm client, as a Node user
// would: a streamed chat completion and a streamed Responses API call.
//
//   SB_URL=http://127.0.0.1:8080 SB_MODEL=demo-model node integration/node/clients.mjs
//
// SB_URL is the gateway's base URL (the client talks to SB_URL/v1), SB_MODEL
// the model to ask for, SB_MAX_TOKENS (optional; unset: no limit) the output
// limit of each call (max_tokens, max_output_tokens). On success it prints one JSON line with what each call got (the Go
// test TestNodeOpenAIClient checks it against the simulator's output) and
// exits 0; on any failure it prints "clients.mjs: FAIL: ..." to stderr and
// exits 1.
import OpenAI from 'openai';
import { pathToFileURL } from 'node:url';

const url = process.env.SB_URL;
const model = process.env.SB_MODEL;
const maxTokens = process.env.SB_MAX_TOKENS ? Number(process.env.SB_MAX_TOKENS) : undefined;

function fail(msg) {
  throw new Error(msg);
}

// chatStream streams a chat completion of model with include_usage: at
// least one chunk with content, then exactly one usage chunk (empty
// choices) after the last content chunk. It returns the text, the number
// of content chunks, the finish reason, the usage and the model the
// chunks named. Exported for chat_stream.mjs.
export async function chatStream(client, model, maxTokens) {
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: 'user', content: 'hello from node' }],
    max_tokens: maxTokens,
    stream: true,
    stream_options: { include_usage: true },
  });
  let content = '';
  let contentChunks = 0;
  let finishReason = null;
  let usage = null;
  let usageChunks = 0;
  let answeredBy = null;
  for await (const chunk of stream) {
    if (usage !== null) {
      fail(`chat: a chunk after the usage chunk: ${JSON.stringify(chunk)}`);
    }
    answeredBy ??= chunk.model;
    for (const choice of chunk.choices ?? []) {
      if (choice.delta?.content) {
        content += choice.delta.content;
        contentChunks++;
      }
      if (choice.finish_reason) {
        finishReason = choice.finish_reason;
      }
    }
    if (chunk.usage) {
      usageChunks++;
      if (chunk.choices.length !== 0) {
        fail(`chat: the usage chunk has choices: ${JSON.stringify(chunk)}`);
      }
      usage = chunk.usage;
    }
  }
  if (contentChunks === 0) {
    fail('chat: the stream had no chunk with content');
  }
  if (usageChunks !== 1 || !(usage.total_tokens > 0)) {
    fail(`chat: ${usageChunks} usage chunks (last ${JSON.stringify(usage)}), want one with total_tokens > 0 since stream_options.include_usage is true`);
  }
  if (!finishReason) {
    fail('chat: no chunk had a finish_reason');
  }
  return { model: answeredBy, content, contentChunks, finishReason, usage };
}

// newClient returns the official client for the gateway at url (its
// /v1), with no retries of its own. Exported for chat_stream.mjs.
export function newClient(url) {
  return new OpenAI({
    baseURL: url.replace(/\/+$/, '') + '/v1',
    apiKey: 'unused',
    maxRetries: 0,
    timeout: 30_000,
  });
}

// run runs main, printing "<name>: FAIL: ..." and exiting 1 on any
// failure. Exported for chat_stream.mjs.
export async function run(name, main) {
  try {
    await main();
  } catch (err) {
    const detail = err instanceof OpenAI.APIError && err.status !== undefined ? ` (status ${err.status}: ${JSON.stringify(err.error)})` : '';
    console.error(`${name}: FAIL: ${err?.message ?? err}${detail}`);
    process.exit(1);
  }
}

// responsesStream streams a Responses API call: the text is the
// response.output_text.delta events, and the stream must end with
// response.completed, whose response holds the same text.
async function responsesStream(client) {
  const stream = await client.responses.create({
    model,
    input: 'hello from node',
    max_output_tokens: maxTokens,
    stream: true,
  });
  const events = [];
  let text = '';
  let completed = null;
  for await (const event of stream) {
    events.push(event.type);
    if (event.type === 'response.output_text.delta') {
      text += event.delta;
    } else if (event.type === 'response.completed') {
      completed = event.response;
    }
  }
  if (completed === null) {
    fail(`responses: no response.completed event in ${JSON.stringify(events)}`);
  }
  if (events.at(-1) !== 'response.completed') {
    fail(`responses: events after response.completed: ${JSON.stringify(events)}`);
  }
  const deltas = events.filter((t) => t === 'response.output_text.delta').length;
  if (deltas === 0) {
    fail(`responses: no response.output_text.delta event in ${JSON.stringify(events)}`);
  }
  const final = completed.output
    .filter((item) => item.type === 'message')
    .flatMap((item) => item.content)
    .filter((part) => part.type === 'output_text')
    .map((part) => part.text)
    .join('');
  if (final !== text) {
    fail(`responses: the deltas make ${JSON.stringify(text)}, response.completed has ${JSON.stringify(final)}`);
  }
  return { text, deltas, first: events[0], last: events.at(-1), status: completed.status, usage: completed.usage };
}

async function main() {
  if (!url || !model) {
    fail('set SB_URL (the gateway base URL) and SB_MODEL');
  }
  const client = newClient(url);
  const chat = await chatStream(client, model, maxTokens);
  const responses = await responsesStream(client);
  console.log(JSON.stringify({ chat, responses }));
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  await run('clients.mjs', main); // run, not imported
}
