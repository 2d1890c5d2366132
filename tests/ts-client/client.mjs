// Drive yuzu's /mcp/v1/ with the official MCP TypeScript SDK (v1, @modelcontextprotocol/sdk) and print
// ONE JSON document of observations on stdout. Used by tests/e2e/test_mcp_official_clients.py.
//
//   MCP_URL=http://127.0.0.1:8000/mcp/v1/ MCP_TOKEN=yuzu_… node tests/ts-client/client.mjs
//
// Sequence: initialize (+ initialized, + the GET stream attempt), ping, tools/list over every page,
// tools/call list_agents (the SDK validates structuredContent against the outputSchema it listed),
// an unknown tool (a JSON-RPC error), then DELETE (terminateSession) and close.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const url = process.env.MCP_URL;
const token = process.env.MCP_TOKEN;
if (!url || !token) {
  process.stderr.write('set MCP_URL and MCP_TOKEN\n');
  process.exit(64);
}

const obs = { client: 'typescript-sdk', http: [] };
const errorObs = (e) => (e && typeof e.code === 'number'
  ? { code: e.code, message: e.message, data: e.data ?? null }
  : { exception: e?.name ?? String(e), message: String(e?.message ?? e).slice(0, 2000) });

// Record every HTTP exchange the SDK makes (method, JSON-RPC method, status).
const loggingFetch = async (input, init = {}) => {
  const entry = { method: (init.method ?? 'GET').toUpperCase(), rpc: null };
  if (typeof init.body === 'string') {
    try { entry.rpc = JSON.parse(init.body).method ?? null; } catch { /* not JSON */ }
  }
  const headers = new Headers(init.headers);
  entry.session = headers.has('mcp-session-id');
  entry.protocol_version = headers.get('mcp-protocol-version');
  entry.authorized = (headers.get('authorization') ?? '').startsWith('Bearer ');
  obs.http.push(entry);
  const response = await fetch(input, init);
  entry.status = response.status;
  entry.content_type = response.headers.get('content-type');
  return response;
};

async function main() {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
    fetch: loggingFetch,
  });
  const client = new Client({ name: 'yuzu-ts-smoke', version: '0.0.1' });
  await client.connect(transport);
  obs.protocol_version = transport.protocolVersion ?? null;
  obs.session_id_length = transport.sessionId ? transport.sessionId.length : 0;
  obs.server_info = client.getServerVersion() ?? null;
  obs.capabilities = client.getServerCapabilities() ?? null;
  obs.instructions_length = (client.getInstructions() ?? '').length;

  try { obs.ping = await client.ping(); } catch (e) { obs.ping = { error: errorObs(e) }; }

  const names = [];
  let cursor;
  let pages = 0;
  do {
    const page = await client.listTools(cursor ? { cursor } : undefined);
    pages += 1;
    for (const t of page.tools) names.push(t.name);
    cursor = page.nextCursor;
  } while (cursor && pages < 50);
  obs.tools = { names, pages };

  obs.calls = {};
  try {
    const r = await client.callTool({ name: 'list_agents', arguments: {} });
    obs.calls.list_agents = { is_error: Boolean(r.isError), structured: r.structuredContent ?? null,
                              content_types: r.content.map((c) => c.type) };
  } catch (e) {
    obs.calls.list_agents = { error: errorObs(e) };
  }
  try {
    const r = await client.callTool({ name: 'no_such_tool', arguments: {} });
    obs.calls.unknown_tool = { is_error: Boolean(r.isError), content: r.content };
  } catch (e) {
    obs.calls.unknown_tool = { error: errorObs(e) };
  }

  try {
    await transport.terminateSession();
    obs.terminated = transport.sessionId === undefined;
  } catch (e) {
    obs.terminated = false;
    obs.terminate_error = errorObs(e);
  }
  await client.close();
  obs.closed = true;
}

let code = 0;
try {
  await main();
} catch (e) {
  obs.fatal = { ...errorObs(e), stack: String(e?.stack ?? '').slice(0, 4000) };
  code = 2;
}
process.stdout.write(JSON.stringify(obs) + '\n');
process.exit(code);
