// Drive yuzu with the official MCP TypeScript client v2 (@modelcontextprotocol/client) in one era and print ONE
// JSON document of observations on stdout. Used by tests/test_mcp_modern_clients.py.
//
//   MCP_URL=http://127.0.0.1:8000/mcp/v1/ MCP_TOKEN=yuzu_… MCP_MODE=auto|pin|legacy \
//   AGENT_ID=… EXEC_ARGS='{"plugin":…}' ASKED=/tmp/asked APPROVED=/tmp/approved node tests/ts-client/eras.mjs
//
// Sequence: connect (auto: server/discover probe; pin: 2026-07-28 with no probe; legacy: initialize), list
// tools/resources/prompts, read a resource, call a read tool, an execution with progress (onprogress), and an
// approval-gated call: on 2026-07-28 the server answers input_required with a URL elicitation, which the
// elicitation handler accepts once the test approved the ticket; on the handshake era it answers -32006 and the
// script re-calls with approval_id after the approval.
import { existsSync, writeFileSync } from 'node:fs';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const { MCP_URL: url, MCP_TOKEN: token, MCP_MODE: mode = 'auto', AGENT_ID: agentId, EXEC_ARGS: execArgs,
        ASKED: asked, APPROVED: approved } = process.env;
if (!url || !token) {
  process.stderr.write('set MCP_URL and MCP_TOKEN\n');
  process.exit(64);
}

const obs = { client: 'typescript-client-v2', mode, http: [], elicitations: [] };
const errorObs = (e) => (e && typeof e.code === 'number'
  ? { code: e.code, message: e.message, data: e.data ?? null }
  : { exception: e?.name ?? String(e), message: String(e?.message ?? e).slice(0, 2000) });
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function waitForFile(path, ms = 60000) {
  const deadline = Date.now() + ms;
  while (!existsSync(path) && Date.now() < deadline) await sleep(50);
  return existsSync(path);
}

const loggingFetch = async (input, init = {}) => {
  const entry = { method: (init.method ?? 'GET').toUpperCase(), rpc: null };
  if (typeof init.body === 'string') {
    try { entry.rpc = JSON.parse(init.body).method ?? null; } catch { /* not JSON */ }
  }
  const headers = new Headers(init.headers);
  entry.session = headers.has('mcp-session-id');
  entry.protocol_version = headers.get('mcp-protocol-version');
  entry.mcp_method = headers.get('mcp-method');
  obs.http.push(entry);
  const response = await fetch(input, init);
  entry.status = response.status;
  entry.content_type = (response.headers.get('content-type') ?? '').split(';')[0];
  return response;
};

async function call(label, params, options) {
  const rec = {};
  try {
    const result = await client.callTool(params, options);
    rec.is_error = Boolean(result.isError);
    rec.structured = result.structuredContent ?? null;
  } catch (e) {
    rec.error = errorObs(e);
  }
  obs.calls[label] = rec;
  return rec;
}

const versionNegotiation = mode === 'legacy' ? undefined
  : { mode: mode === 'pin' ? { pin: '2026-07-28' } : 'auto' };
const client = new Client({ name: 'yuzu-ts-eras', version: '0.0.1' },
  { capabilities: { elicitation: { url: {} } }, ...(versionNegotiation ? { versionNegotiation } : {}) });
client.setRequestHandler('elicitation/create', async (request) => {
  obs.elicitations.push(request.params);
  if (asked) writeFileSync(asked, '');
  if (approved) await waitForFile(approved);
  return { action: 'accept' };
});

async function main() {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
    fetch: loggingFetch,
  });
  await client.connect(transport);
  obs.era = client.getProtocolEra() ?? null;
  obs.server_info = client.getServerVersion() ?? null;
  obs.calls = {};
  obs.tools = (await client.listTools()).tools.map((t) => t.name);
  obs.resources = (await client.listResources()).resources.map((r) => r.uri);
  obs.prompts = (await client.listPrompts()).prompts.map((p) => p.name);
  const about = await client.readResource({ uri: 'yuzu://about' });
  obs.about_mime = about.contents[0]?.mimeType ?? null;
  try {
    await client.readResource({ uri: 'yuzu://no-such-resource' });
    obs.missing_resource = null;
  } catch (e) {
    obs.missing_resource = errorObs(e);
  }
  await call('list_agents', { name: 'list_agents', arguments: {} });
  if (execArgs) {
    const progress = [];
    const rec = await call('execution', { name: 'execute_instruction', arguments: JSON.parse(execArgs) },
      { onprogress: (p) => progress.push(p.progress), timeout: 120000 });
    rec.progress = progress;
  }
  if (agentId) {
    const args = { agent_id: agentId, key: 'role' };
    const first = await call('gated', { name: 'delete_tag', arguments: args }, { timeout: 120000 });
    if (first.error?.code === -32006) {
      if (asked) writeFileSync(asked, '');
      await waitForFile(approved);
      await call('gated', { name: 'delete_tag', arguments: { ...args, approval_id: first.error.data.approval_id } });
      obs.calls.gated.via = 'ticket';
    } else {
      first.via = obs.elicitations.length ? 'elicitation' : null;
    }
  }
  await transport.close?.();
}

main()
  .then(() => { process.stdout.write(JSON.stringify(obs) + '\n'); process.exit(0); })
  .catch((e) => {
    obs.fatal = { ...errorObs(e), stack: String(e?.stack ?? '').slice(0, 3000) };
    process.stdout.write(JSON.stringify(obs) + '\n');
    process.exit(2);
  });
