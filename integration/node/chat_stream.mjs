// Streams one chat completion with include_usage through the gateway with
// the official openai npm client, as a Node user would:
//
//   SB_URL=http://127.0.0.1:8080 SB_MODEL=demo-model node integration/node/chat_stream.mjs
//
// SB_URL is the gateway's base URL (the client talks to SB_URL/v1), SB_MODEL
// the model to ask for. On success it prints one JSON line {model, content,
// contentChunks, finishReason, usage} (the Go test TestProviderOverflowNode
// checks it against the provider simulator's output) and exits 0; on any
// failure it prints "chat_stream.mjs: FAIL: ..." to stderr and exits 1. The
// stream and its checks are clients.mjs's chatStream.
import { chatStream, newClient, run } from './clients.mjs';

await run('chat_stream.mjs', async () => {
  const url = process.env.SB_URL;
  const model = process.env.SB_MODEL;
  if (!url || !model) {
    throw new Error('set SB_URL (the gateway base URL) and SB_MODEL');
  }
  console.log(JSON.stringify(await chatStream(newClient(url), model, undefined)));
});
