// An MCP host on the official TypeScript SDK, run by mcpserver's interop test against a real
// toolfence MCP server. The one argument is a JSON job:
//   {"transport": "stdio", "command": "...", "args": [...], "env": {...}}
//   {"transport": "http", "url": "http://127.0.0.1:PORT/mcp", "token": "..."}
// It connects, lists the tools, runs begin_call -> commit_call -> begin_call (replay), leaves
// one call open and reads toolfence://pending, then prints one JSON line of what it saw. A
// step that throws prints {"step": NAME, "error": MESSAGE} instead and exits 1.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const job = JSON.parse(process.argv[2]);
setTimeout(() => fail("timeout", new Error("no answer within 30s")), 30_000).unref();

let step = "connect";
function fail(at, err) {
  console.log(JSON.stringify({ step: at, error: String(err?.stack ?? err) }));
  process.exit(1);
}

function transportOf(job) {
  if (job.transport === "stdio") {
    return new StdioClientTransport({
      command: job.command,
      args: job.args,
      env: { ...getDefaultEnvironment(), ...job.env },
      stderr: "inherit",
    });
  }
  return new StreamableHTTPClientTransport(new URL(job.url), {
    requestInit: { headers: { Authorization: `Bearer ${job.token}` } },
  });
}

// observeProtocolVersion records the protocolVersion of the initialize result as it arrives.
function observeProtocolVersion(transport, seen) {
  let handler;
  Object.defineProperty(transport, "onmessage", {
    configurable: true,
    get: () => handler,
    set: (h) => {
      handler = (msg, extra) => {
        if (msg?.result?.protocolVersion) seen.protocolVersion = msg.result.protocolVersion;
        return h?.(msg, extra);
      };
    },
  });
}

async function call(client, name, args) {
  const res = await client.callTool({ name, arguments: args });
  if (res.isError) throw new Error(`${name}: ${res.content?.[0]?.text}`);
  return res;
}

async function main() {
  const out = {};
  const transport = transportOf(job);
  observeProtocolVersion(transport, out);
  const client = new Client({ name: "ts-sdk-interop", version: "1" });
  await client.connect(transport);
  out.server = client.getServerVersion()?.name;

  step = "listTools";
  const tools = await client.listTools();
  out.tools = tools.tools.map((t) => t.name);

  const args = { task: "ts-run", operation: "send_email", target: "email:bob@example.com", args: { subject: "hello" } };
  step = "begin_call";
  const begin = (await call(client, "begin_call", args)).structuredContent;
  out.begin = { decision: begin.decision, key: begin.key, token: begin.token };

  step = "commit_call";
  const commit = (await call(client, "commit_call", {
    key: begin.key, token: begin.token, lease_secret: begin.lease_secret,
    outcome: "succeeded", result: { message_id: "m-1" }, upstream_status: 200,
  })).structuredContent;
  out.commit = { state: commit.state, token: commit.token };

  step = "replay";
  const replay = await call(client, "begin_call", args);
  out.replay = { decision: replay.structuredContent.decision, result: replay.structuredContent.result, text: replay.content[0].text };

  step = "open";
  const open = (await call(client, "begin_call", { ...args, target: "email:carol@example.com" })).structuredContent;
  out.open = { decision: open.decision, key: open.key };

  step = "readResource";
  const pending = await client.readResource({ uri: "toolfence://pending" });
  const contents = pending.contents[0];
  out.pending = { uri: contents.uri, mimeType: contents.mimeType, keys: JSON.parse(contents.text).residuals.map((r) => r.key) };

  step = "close";
  await client.close();
  console.log(JSON.stringify(out));
}

main().then(() => process.exit(0), (err) => fail(step, err));
