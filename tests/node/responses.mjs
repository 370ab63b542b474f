// The official openai Node SDK's responses.create against a running ggserve:
// one plain and one streamed request; prints what came back as JSON.
// Usage: node responses.mjs BASE_URL INPUT MAX_OUTPUT_TOKENS
import OpenAI from "openai";

const [baseURL, input, maxTokens] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0 });
const request = { model: "gpt-4o-mini", input, max_output_tokens: Number(maxTokens), temperature: 0 };

const plain = await client.responses.create(request);
const events = [];
let streamed = "";
for await (const event of await client.responses.create({ ...request, stream: true })) {
  events.push([event.type, event.sequence_number]);
  if (event.type === "response.output_text.delta") streamed += event.delta;
}
console.log(JSON.stringify({
  plain: { status: plain.status, text: plain.output_text, usage: plain.usage },
  streamed, events,
}));
