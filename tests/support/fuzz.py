"""Hypothesis strategies for hostile and valid-ish JSON-RPC bodies, derived from the real MCP catalogues:
tool names and arguments follow each tool's inputSchema (valid values, values at and past their bounds,
wrong types), wrapped in messages that are well-formed, malformed, nested too deep, batched, carrying
duplicate keys, huge numbers, NaN, lone surrogates or strings near the body limit. Shared by
tests/yuzu/test_fuzz.py (in-process) and bench/fuzz/run.py (a real daphne)."""

import json

from hypothesis import strategies as st

from mcp.registry import catalogue
from mcp.server import LOG_LEVELS, METHODS, SUPPORTED_VERSIONS

MAX_BODY = 4 * 1024 * 1024
# Arguments that make a well-behaved call legitimately wait (a bridge poll may hold for 10 minutes): always
# present and short, so that the fuzz measures answers, not patience.
WAITS = {"timeoutMs": st.integers(0, 50)}

NASTY_STRINGS = [
    "", " ", "\x00", "\x1b[201~rm -rf /\r", "\u202e\u2066", "\ufeff", "../../../../etc/passwd", "' OR 1=1 --",
    "%s%n%x", "${jndi:ldap://x}", "{{7*7}}", "<script>alert(1)</script>", "\r\n\r\nHTTP/1.1 200 OK", "NaN", "null",
    "ostype == linux AND", "((((((((((((((((((((((((((((((((((((((((x", "tag:", "group:", "__all__", "\\", "\"",
    "😀" * 40, "a" * 129, "a" * 257, "a" * 8193, "é" * 5000,
]
HUGE_NUMBERS = [10 ** 400, -(10 ** 400), 2 ** 63, 2 ** 64, -(2 ** 63) - 1, 1e308, -1e308, 5e-324, -0.0, 253402300800,
                99999999999999]

def weighted(*pairs):
    """One of the strategies, drawn with the given weights (hypothesis' one_of favours no branch)."""
    return st.sampled_from([s for s, n in pairs for _ in range(n)]).flatmap(lambda s: s)


surrogates = st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=3)  # not Unicode text
text = weighted((st.text(max_size=40), 6), (st.sampled_from(NASTY_STRINGS), 3), (surrogates, 1))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(HUGE_NUMBERS),
                    st.floats(allow_nan=False, allow_infinity=False), text)
any_json = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(text, c, max_size=4),
                        max_leaves=10)


def from_schema(schema, depth=0):
    """Values for a JSON schema: mostly valid, often at or just past its bounds, sometimes the wrong type."""
    wrong = any_json if depth < 3 else scalars
    if "enum" in schema:
        return st.one_of(st.sampled_from(schema["enum"]), text, wrong)
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    options = []
    for t in types:
        if t == "object":
            options.append(_object(schema, depth))
        elif t == "string":
            hi = schema.get("maxLength", 256)
            options.append(st.one_of(text, st.text(max_size=min(hi, 64)), st.sampled_from([hi, hi + 1]).map(
                lambda n: "a" * n)))
        elif t == "integer":
            lo, hi = schema.get("minimum", -(2 ** 31)), schema.get("maximum", 2 ** 31)
            options.append(st.one_of(st.integers(lo, hi), st.sampled_from([lo - 1, hi + 1, lo, hi]),
                                     st.sampled_from(HUGE_NUMBERS), st.floats(allow_nan=False)))
        elif t == "number":
            options.append(st.one_of(st.floats(allow_nan=False), st.sampled_from(HUGE_NUMBERS)))
        elif t == "boolean":
            options.append(st.booleans())
        elif t == "array":
            items = from_schema(schema.get("items", {}), depth + 1)
            options.append(st.lists(items, max_size=min(schema.get("maxItems", 8), 8)))
        elif t == "null":
            options.append(st.none())
    if not options:
        return wrong
    return st.one_of(*options, wrong)


def _object(schema, depth):
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    # A wait argument is always drawn (short): left out, its default holds a valid call for minutes (a bridge_send to
    # a worker the fuzz spawned waits up to 10 minutes for a reply that nobody sends).
    required = set(schema.get("required", [])) | (set(WAITS) & set(props))

    fields = {k: (WAITS[k] if k in WAITS else from_schema(v, depth + 1)) for k, v in props.items()}
    optional = st.fixed_dictionaries({k: fields[k] for k in required},
                                     optional={k: fields[k] for k in props if k not in required})
    unexpected = st.dictionaries(text, any_json if depth < 2 else scalars, max_size=2)
    if isinstance(extra, dict):
        unexpected = st.dictionaries(text, from_schema(extra, depth + 1), max_size=3)
    return st.one_of(optional, optional, st.tuples(optional, unexpected).map(lambda p: {**p[1], **p[0]}))


def tool_calls(cat_name):
    tools = sorted(catalogue(cat_name).tools.values(), key=lambda t: t.name)
    known = st.sampled_from(tools).flatmap(lambda t: st.fixed_dictionaries(
        {"name": st.just(t.name), "arguments": from_schema(t.input_schema)},
        optional={"_meta": st.fixed_dictionaries({}, optional={"progressToken": st.one_of(st.integers(), text)})}))
    unknown = st.fixed_dictionaries({"name": st.one_of(text, any_json)}, optional={"arguments": any_json})
    return weighted((known, 8), (unknown, 1))


def params_for(cat_name):
    cat = catalogue(cat_name)
    return {
        "tools/call": tool_calls(cat_name),
        "initialize": st.fixed_dictionaries({}, optional={
            "protocolVersion": st.one_of(st.sampled_from(SUPPORTED_VERSIONS), text),
            "capabilities": any_json, "clientInfo": st.one_of(any_json, st.fixed_dictionaries(
                {"name": text, "version": text}))}),
        "resources/read": st.fixed_dictionaries({"uri": st.one_of(st.sampled_from(sorted(cat.resources) or ["x"]),
                                                                  text, any_json)}),
        "prompts/get": st.fixed_dictionaries({"name": st.one_of(st.sampled_from(sorted(cat.prompts) or ["x"]), text)},
                                             optional={"arguments": st.one_of(st.dictionaries(text, text), any_json)}),
        "logging/setLevel": st.fixed_dictionaries({"level": st.one_of(st.sampled_from(LOG_LEVELS), text)}),
        "tools/list": st.fixed_dictionaries({}, optional={"cursor": st.one_of(text, any_json)}),
        "resources/list": st.fixed_dictionaries({}, optional={"cursor": st.one_of(text, any_json)}),
        "completion/complete": st.fixed_dictionaries({}, optional={"ref": any_json, "argument": any_json}),
    }


def messages(cat_name):
    """JSON-RPC messages: mostly well-formed requests whose params follow the method, then every way to be wrong."""
    per_method = params_for(cat_name)
    # tools/call is where the depth is (the pipeline, the tools' own validation, the handlers): most requests
    method = st.sampled_from(["tools/call"] * 12 + sorted(METHODS) + ["notifications/cancelled",
                                                                     "notifications/initialized"])
    ids = st.one_of(st.integers(-(2 ** 31), 2 ** 31), st.text(max_size=20))
    bad_ids = st.one_of(st.none(), st.booleans(), st.floats(), st.sampled_from(HUGE_NUMBERS), any_json)
    request = method.flatmap(lambda m: st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "method": st.just(m), "id": ids,
         "params": per_method.get(m, st.one_of(st.just({}), any_json))}))
    notification = method.flatmap(lambda m: st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "method": st.just(m), "params": per_method.get(m, st.just({}))}))
    wrong = st.dictionaries(st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error"]) | text,
                            any_json, max_size=5)
    odd = st.fixed_dictionaries({"jsonrpc": st.one_of(text, any_json, st.just("2.0")), "id": st.one_of(ids, bad_ids),
                                 "method": method | text}, optional={"params": any_json})
    return weighted((request, 12), (notification, 1), (wrong, 1), (odd, 1))


def _dump(msg, ascii_only):
    return json.dumps(msg, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def deep(n, opener="[", closer="]"):
    return (opener * n + closer * n).encode()


def bodies(cat_name, large=False):
    """Raw request bodies (bytes)."""
    msgs = messages(cat_name)
    framed = st.tuples(msgs, st.booleans()).map(lambda p: _dump(*p))
    batch = st.lists(msgs, min_size=0, max_size=3).map(lambda m: json.dumps(m).encode())
    nested = st.one_of(st.integers(30, 40).map(lambda n: (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents","arguments":'
        + "[" * n + "]" * n + "}}").encode()),
        st.integers(1, 3000).map(deep), st.integers(1, 3000).map(lambda n: ('{"a":' * n + "1" + "}" * n).encode()))
    literal = st.sampled_from([
        b'{"jsonrpc":"2.0","id":1,"id":"two","method":"ping","method":"tools/list"}',
        b'{"jsonrpc":"2.0","id":1e999,"method":"ping"}', b'{"jsonrpc":"2.0","id":NaN,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_agents","arguments":{"limit":Infinity}}}',
        b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"ping"}', b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\\udfff\\ud800"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"\\u0000"}', b"\xef\xbb\xbf{}", b"", b" ", b"null", b"[]", b"{}", b"1",
        b'"2.0"', b"\xff\xfe\x00", b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"list_agents"}}',
    ])
    garbage = st.binary(max_size=200)
    options = [(framed, 24), (batch, 1), (nested, 1), (literal, 1), (garbage, 1)]
    if large:
        options.append((st.sampled_from([1 << 16, 1 << 20, MAX_BODY - 200, MAX_BODY + 10]).map(lambda n: (
            '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"classify_operational_question",'
            '"arguments":{"question":"' + "q" * n + '"}}}').encode()), 1))
    return weighted(*options)


# --- 2026-07-28 requests: the envelope in _meta and the headers that must repeat it -------------------------

MODERN = "2026-07-28"
header_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=40)
client_capabilities = weighted((st.just({}), 4), (st.just({"elicitation": {"url": {}}}), 2),
                               (st.just({"extensions": {"io.modelcontextprotocol/tasks": {}}}), 2), (any_json, 1))


def modern_meta():
    envelope = st.fixed_dictionaries(
        {"io.modelcontextprotocol/protocolVersion": weighted((st.just(MODERN), 8), (any_json, 1)),
         "io.modelcontextprotocol/clientCapabilities": client_capabilities},
        optional={"io.modelcontextprotocol/clientInfo": st.one_of(any_json, st.fixed_dictionaries(
            {"name": text, "version": text})), "progressToken": st.one_of(st.integers(), text)})
    return weighted((envelope, 12), (any_json, 1))


def modern_requests(cat_name):
    """(body, headers) of 2026-07-28 requests: mostly well-formed, with headers agreeing with the body, then
    headers that lie, are missing or carry junk, and envelopes that are wrong."""
    per_method = params_for(cat_name)
    methods = st.sampled_from(["tools/call"] * 12 + sorted(per_method) + [
        "server/discover", "tasks/get", "tasks/cancel", "tasks/update", "ping", "initialize"] + [
        "subscriptions/listen"] * 2)
    listen_params = st.fixed_dictionaries({"notifications": weighted((st.fixed_dictionaries({}, optional={
        "taskIds": st.one_of(any_json, st.lists(st.one_of(text, st.just("e30:1:x"), any_json), max_size=70)),
        "toolsListChanged": any_json}), 4), (any_json, 1))})

    def build(method, params, meta, rid, state, lie):
        params = dict(params) if isinstance(params, dict) else {}
        params["_meta"] = meta
        if state is not None:
            params["requestState" if method == "tools/call" else "taskId"] = state
        msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        headers = {"mcp-protocol-version": MODERN, "mcp-method": method}
        name = params.get({"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}.get(method, "taskId"))
        if isinstance(name, str) and name.isascii() and name.isprintable():
            headers["mcp-name"] = name
        headers.update(lie)
        return json.dumps(msg).encode("utf-8", "surrogatepass"), {k: v for k, v in headers.items() if v is not None}

    lies = weighted((st.just({}), 10), (st.dictionaries(
        st.sampled_from(["mcp-protocol-version", "mcp-method", "mcp-name"]), st.one_of(st.none(), header_text),
        max_size=3), 2))
    return st.builds(build, methods, st.deferred(lambda: st.one_of(*per_method.values(), listen_params, any_json)),
                     modern_meta(),
                     st.one_of(st.integers(0, 2 ** 31), st.text(max_size=20)),
                     weighted((st.none(), 6), (text, 1), (st.just("e30:1:x"), 1)), lies)
