// One person's tab, for tests/test_edit_resend_client.py: static/client.js (the `ws`
// package as its WebSocket) connects, reports one edit once welcomed, and prints every
// event it gets as a JSON line until that edit is acknowledged (or 20 s pass).
//   node edit_resend.mjs <ws base url> <token> <document id>
import WebSocket from "ws";
import { CowriteClient } from "../../static/client.js";

const [baseUrl, token, documentId] = process.argv.slice(2);
const client = new CowriteClient({ baseUrl, documentId, getToken: () => token, clientId: "b",
                                   WebSocketImpl: WebSocket, heartbeatMs: 0 });
let editId = null;
const giveUp = setTimeout(() => {
  console.log(JSON.stringify({ type: "timeout" }));
  client.close();
}, 20_000);
client.addEventListener("event", ({ detail }) => {
  console.log(JSON.stringify(detail));
  if (detail.type === "ack" && editId !== null && detail.reply_to === editId) {
    clearTimeout(giveUp);
    client.close();
  }
});
client.addEventListener("state", ({ detail }) => {
  if (detail.state !== "open" || editId !== null) return;
  client.editorChange({ documentVersion: 2, summary: "typing" });
  editId = [...(client.editsSent?.keys() ?? [])][0] ?? "";
  console.log(JSON.stringify({ type: "edit.sent", id: editId }));
});
client.connect();
