// Call execute_instruction with an onprogress handler through the official MCP TypeScript SDK (v1,
// @modelcontextprotocol/sdk) and print ONE JSON document of what the client saw: every progress
// notification (value, total, arrival time), the result, then a status read by execution_id.
// Used by tests/e2e/test_streaming_e2e.py.
//
//   MCP_URL=http://127.0.0.1:8000/mcp/v1/ MCP_TOKEN=yuzu_… MCP_ARGS='{"plugin":"os","action":"info"}' \
//     node tests/ts-client/progress.mjs
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const url = process.env.MCP_URL;
const token = process.env.MCP_TOKEN;
const args = JSON.parse(process.env.MCP_ARGS ?? '{"plugin":"os","action":"info"}');
if (!url || !token) {
  process.stderr.write('set MCP_URL and MCP_TOKEN\n');
  process.exit(64);
}

const obs = { client: 'typescript-sdk', http: [] };
const errorObs = (e) => (e && typeof e.code === 'number'
  ? { code: e.code, message: e.message, data: e.data ?? null }
  : { exception: e?.name ?? String(e), message: String(e?.message ?? e).slice(0, 2000) });

const loggingFetch = async (input, init = {}) => {
  const entry = { method: (init.method ?? 'GET').toUpperCase(), rpc: null, progress_token: false };
  if (typeof init.body === 'string') {
    try {
      const body = JSON.parse(init.body);
      entry.rpc = body.method ?? null;
      entry.progress_token = body.params?._meta?.progressToken !== undefined;
    } catch { /* not JSON */ }
  }
  entry.accept = new Headers(init.headers).get('accept');
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
  const client = new Client({ name: 'yuzu-ts-progress', version: '0.0.1' });
  await client.connect(transport);
  obs.protocol_version = transport.protocolVersion ?? null;

  // List every page, so the SDK validates structuredContent against the outputSchema it listed.
  let cursor;
  let pages = 0;
  do {
    const page = await client.listTools(cursor ? { cursor } : undefined);
    pages += 1;
    cursor = page.nextCursor;
  } while (cursor && pages < 50);

  const progress = [];
  const t0 = performance.now();
  const at = () => Math.round(performance.now() - t0) / 1000;
  try {
    const r = await client.callTool({ name: 'execute_instruction', arguments: args }, undefined, {
      onprogress: (p) => progress.push({ progress: p.progress, total: p.total ?? null,
                                         message: p.message ?? null, at: at() }),
      timeout: 150000,
    });
    obs.call = { is_error: Boolean(r.isError), structured: r.structuredContent ?? null, at: at() };
  } catch (e) {
    obs.call = { error: errorObs(e) };
  }
  obs.progress = progress;
  const executionId = obs.call.structured?.execution_id;
  if (executionId) {
    const s = await client.callTool({ name: 'get_execution_status', arguments: { execution_id: executionId } });
    obs.status = s.structuredContent ?? null;
  }
  try {
    await transport.terminateSession();
  } catch (e) {
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
