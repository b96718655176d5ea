// Streams one chat completion with include_usage through the gateway with
// the official openai npm client, as a Node user would:
//
//   SB_URL=http://127.0.0.1:8080 SB_MODEL=demo-model node integration/node/chat_stream.mjs
//
// SB_URL is the gateway's base URL (the client talks to SB_URL/v1), SB_MODEL
// the model to ask for. On success it prints one JSON line {model, content,
// contentChunks, finishReason, usage} (the Go test TestProviderOverflowNode
// checks it against the provider simulator's output) and exits 0; on any
// failure it prints "chat_stream.mjs: FAIL: ..." to stderr and exits 1.
import OpenAI from 'openai';

const url = process.env.SB_URL;
const model = process.env.SB_MODEL;

function fail(msg) {
  throw new Error(msg);
}

async function main() {
  if (!url || !model) {
    fail('set SB_URL (the gateway base URL) and SB_MODEL');
  }
  const client = new OpenAI({
    baseURL: url.replace(/\/+$/, '') + '/v1',
    apiKey: 'unused',
    maxRetries: 0,
    timeout: 30_000,
  });
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: 'user', content: 'hello from node' }],
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
      fail(`a chunk after the usage chunk: ${JSON.stringify(chunk)}`);
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
        fail(`the usage chunk has choices: ${JSON.stringify(chunk)}`);
      }
      usage = chunk.usage;
    }
  }
  if (contentChunks === 0) {
    fail('the stream had no chunk with content');
  }
  if (usageChunks !== 1 || !(usage.total_tokens > 0)) {
    fail(`${usageChunks} usage chunks (last ${JSON.stringify(usage)}), want one with total_tokens > 0 since stream_options.include_usage is true`);
  }
  if (!finishReason) {
    fail('no chunk had a finish_reason');
  }
  console.log(JSON.stringify({ model: answeredBy, content, contentChunks, finishReason, usage }));
}

try {
  await main();
} catch (err) {
  const detail = err instanceof OpenAI.APIError && err.status !== undefined ? ` (status ${err.status}: ${JSON.stringify(err.error)})` : '';
  console.error(`chat_stream.mjs: FAIL: ${err?.message ?? err}${detail}`);
  process.exit(1);
}
