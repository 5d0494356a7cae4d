// Generates static/protocol.d.ts from protocol/schema.json with json-schema-to-typescript.
//
//   node tests/node/gen-types.mjs              # writes static/protocol.d.ts (`make docs` runs it)
//   node tests/node/gen-types.mjs --out DIR    # writes DIR/protocol.d.ts (the drift test does this)
//
// Before compiling, the schema is reshaped for TypeScript, never changed in meaning:
// - client messages are named `<Model>Message` and server events `<Model>Event`
//   (`ErrorEvent`, not `Error`, which would shadow the global), nested objects keep
//   their model name (`ToolSpec`, `RunSnapshot`);
// - a property of any JSON value (`{}`) is typed `unknown`, not an object;
// - pydantic's per-property titles ("Run Id") are dropped, or the compiler would emit
//   one named alias per property (`RunId`, `RunId1`, ...);
// - the two unions become `ClientMessage` and `ServerEvent`, discriminated by `type`.
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { compile } from "json-schema-to-typescript";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "..", "..");
const SCHEMA = join(root, "protocol", "schema.json");
const BANNER = `/**
 * cowrite wire protocol v1: every client->server message and server->client event.
 *
 * GENERATED from protocol/schema.json by tests/node/gen-types.mjs: do not edit.
 * Regenerate with \`make docs\`. Reference: docs/protocol.md.
 */`;

function refName(ref) {
  return ref.slice(ref.lastIndexOf("/") + 1);
}

const SHAPE_KEYWORDS = ["type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const", "properties",
  "items", "tsType"];

/** `{}` (pydantic's `Any`) means any JSON value; the compiler would make it an object. */
function markAnyJson(node) {
  if (node && typeof node === "object" && !SHAPE_KEYWORDS.some((key) => key in node)) {
    node.tsType = "unknown";
  }
}

function dropPropertyTitles(node, isDefinition) {
  if (Array.isArray(node)) {
    node.forEach((item) => dropPropertyTitles(item, false));
  } else if (node && typeof node === "object") {
    if (!isDefinition) delete node.title;
    for (const [key, value] of Object.entries(node)) {
      // "properties" maps names to schemas: its keys are not keywords.
      if (key === "properties") {
        for (const prop of Object.values(value)) {
          markAnyJson(prop);
          dropPropertyTitles(prop, false);
        }
      }
      else if (key !== "enum" && key !== "const" && key !== "default") dropPropertyTitles(value, false);
    }
  }
}

/** The schema reshaped for the compiler (see the header). Pure. */
export function typescriptSchema(schema) {
  const defs = structuredClone(schema.$defs);
  const unions = {};
  for (const [key, title, suffix] of [
    ["client_message", "ClientMessage", "Message"],
    ["server_event", "ServerEvent", "Event"],
  ]) {
    const union = schema.properties[key];
    const names = union.oneOf.map((member) => refName(member.$ref));
    for (const name of names) defs[name].title = `${name}${suffix}`;
    unions[key] = {
      title,
      description: union === schema.properties.client_message
        ? "Any message a client may send; `type` tells which."
        : "Any event the server sends; `type` tells which.",
      oneOf: names.map((name) => ({ $ref: `#/$defs/${name}` })),
    };
  }
  for (const [name, definition] of Object.entries(defs)) {
    dropPropertyTitles(definition, true);
    definition.title ??= name;
  }
  return {
    title: "ProtocolFrame",
    description: "One JSON text frame on a cowrite WebSocket, in either direction.",
    anyOf: [unions.client_message, unions.server_event],
    $defs: defs,
  };
}

export async function generate(schema) {
  return compile(typescriptSchema(schema), "ProtocolFrame", {
    bannerComment: BANNER,
    additionalProperties: false,
    unknownAny: true,
    strictIndexSignatures: false,
    format: true,
    style: { printWidth: 100, singleQuote: false },
  });
}

async function main(argv) {
  const at = argv.indexOf("--out");
  const outDir = at >= 0 ? resolve(argv[at + 1]) : join(root, "static");
  const text = await generate(JSON.parse(readFileSync(SCHEMA, "utf8")));
  mkdirSync(outDir, { recursive: true });
  const target = join(outDir, "protocol.d.ts");
  writeFileSync(target, text);
  process.stderr.write(`wrote ${target}\n`);
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await main(process.argv.slice(2));
}
