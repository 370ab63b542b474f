// The official openai Node SDK's embeddings.create against a running ggserve:
// the same input as floats and as base64 (the SDK's default, which it decodes);
// prints both vectors and the usage as JSON.
// Usage: node embeddings.mjs BASE_URL INPUT
import OpenAI from "openai";

const [baseURL, input] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0 });

const asFloat = await client.embeddings.create({ model: "any", input, encoding_format: "float" });
const asDefault = await client.embeddings.create({ model: "any", input: [input, input] });
console.log(JSON.stringify({
  float: asFloat.data[0].embedding,
  base64: asDefault.data.map((d) => Array.from(d.embedding)),
  usage: asFloat.usage,
  object: asFloat.object,
}));
