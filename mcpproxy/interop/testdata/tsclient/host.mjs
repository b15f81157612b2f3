// An MCP host on the official TypeScript SDK, run by mcpproxy/interop's Go tests in front of
// `toolfence proxy` (or straight against an upstream fixture). The one argument is a JSON job:
//   {"command": "...", "args": [...], "env": {...}, "calls": [{"name": ..., "arguments": ..., "_meta": ...}]}
//   {"url": "http://127.0.0.1:PORT/mcp", "token": "...", "calls": [...]}
// It connects over stdio (or streamable HTTP with a bearer token), lists the tools, makes the
// calls in order, and prints one JSON line:
//   {"tools": [...as listTools returned them...], "results": [...each callTool result...]}
// A step that throws prints {"step": NAME, "error": MESSAGE} instead and exits 1.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const job = JSON.parse(process.argv[2]);
setTimeout(() => fail("timeout", new Error("no answer within 40s")), 40_000).unref();

let step = "connect";
function fail(at, err) {
  console.log(JSON.stringify({ step: at, error: String(err?.stack ?? err) }));
  process.exit(1);
}

async function main() {
  const transport = job.url
    ? new StreamableHTTPClientTransport(new URL(job.url), {
        requestInit: { headers: { Authorization: `Bearer ${job.token}` } },
      })
    : new StdioClientTransport({
        command: job.command,
        args: job.args,
        env: { ...getDefaultEnvironment(), ...job.env },
        stderr: "inherit",
      });
  const client = new Client({ name: "ts-sdk-host", version: "1" });
  await client.connect(transport);
  step = "listTools";
  const { tools } = await client.listTools();
  const results = [];
  for (const [i, c] of (job.calls ?? []).entries()) {
    step = `callTool ${i} ${c.name}`;
    const params = { name: c.name, arguments: c.arguments };
    if (c._meta) params._meta = c._meta;
    results.push(await client.callTool(params));
  }
  step = "close";
  await client.close();
  console.log(JSON.stringify({ tools, results }));
}

main().then(() => process.exit(0), (err) => fail(step, err));
