// What the adapter node tests share: a free port, the scripted model's prompts, the
// tools they offer, and the last state of an AI SDK UI message stream.
import { createServer } from "node:net";
import { readUIMessageStream } from "ai";

export const freePort = () => new Promise((resolve) => {
  const probe = createServer().listen(0, "127.0.0.1", () => {
    const { port } = probe.address();
    probe.close(() => resolve(port));
  });
});

export const script = (...steps) => JSON.stringify({ script: steps, chunk_chars: 4, delay_ms: 0 });
export const READ = { name: "read_document", description: "Read the document.",
  parameters: { type: "object", properties: {}, additionalProperties: false } };
export const user = (text, id = "u1") => ({ id, role: "user", parts: [{ type: "text", text }] });

/** The UI message as it stands once `stream` ends (continuing `message`, if given). */
export async function last(stream, message) {
  let final;
  for await (const snapshot of readUIMessageStream({ stream, message })) final = snapshot;
  return final;
}

/** An AG-UI agent whose first run reads the document through the frontend's tool,
 * then says "Done reading." once the tool's result comes back. */
export function readingAgent(HttpAgent, url, threadId, token) {
  const agent = new HttpAgent({ url, threadId, headers: { authorization: `Bearer ${token}` } });
  agent.addMessage({ id: "m1", role: "user",
    content: script({ say: "Let me read.", tool_calls: [{ name: "read_document", arguments: {} }] },
      { say: "Done reading." }) });
  const tools = [{ name: READ.name, description: READ.description, parameters: READ.parameters }];
  return { agent, tools };
}
