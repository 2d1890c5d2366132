"""The declarative registry of MCP tools, resources and prompts.

Each app declares its tools in ``<app>/mcp_tools.py`` (discovered at start-up the way Django
discovers ``admin.py``)::

    from mcp.registry import tool

    @tool(name="list_agents", title="List agents", securable="Infrastructure", operation="Read",
          description="… An empty list means …", input_schema={...}, output_schema={...})
    def list_agents(ctx, args):
        return {...}            # the structured result; the pipeline adds the text block

A handler may be ``async def`` (the bridge's blocking tools); sync handlers run in one worker-thread
hop together with the checks and the audit row. Handlers raise ``yuzu.errors.YuzuError`` for
JSON-RPC errors and ``ToolFailure`` for a business failure (a result with ``isError: true``).
"""

import asyncio
import importlib
from dataclasses import dataclass, field

from django.apps import apps

from yuzu.plans import Plan  # noqa: F401  (tools build Plans; see yuzu.plans)
from yuzu.policy import requires_approval

DEFAULT_CATALOGUE = "v1"
EFFECTS = ("read", "additive", "destructive")
SERVICE_SCOPE_CLASSES = ("denied", "confined")


class ToolFailure(Exception):
    """A tool's own business failure: answered as a result with ``isError: true``."""

    def __init__(self, message, data=None):
        super().__init__(message)
        self.message = message
        self.data = data or {}


@dataclass
class Tool:
    name: str
    title: str
    description: str
    securable: str
    operation: str
    input_schema: dict
    output_schema: dict | None
    handler: object
    effect: str = "read"
    idempotent: bool = True
    service_scope: str = "denied"
    rbac: bool = True
    # Object-level permission (DRF's has_object_permission): allows(principal, tool, args) -> bool, declared
    # by the app that owns the object (it may raise yuzu.errors.PermissionDenied to say why it refuses);
    # without it RBAC asks for the permission on any scope.
    object_permission: object = None
    catalogue: str = DEFAULT_CATALOGUE
    poll: bool = False
    precondition: object = None
    prepare: object = None  # prepare(ctx, args, pinned=None) -> yuzu.plans.Plan: the tool's one validation
    progress: bool = False  # may report notifications/progress (ctx.follow) and stream a POST response
    module: str = ""

    @property
    def is_async(self):
        return asyncio.iscoroutinefunction(self.handler)

    @property
    def gate_capable(self):
        """Approval-gated on some tier: its schema carries approval_id, which the handler never sees."""
        return any(requires_approval(t, self.securable, self.operation) for t in ("operator", "supervised"))

    def plan(self, ctx, args, pinned=None):
        """The call's Plan: the tool's own ``prepare``, or the arguments as they are."""
        if self.prepare is not None:
            return self.prepare(ctx, args, pinned=pinned)
        return Plan(summary=f"{self.title}", value=args, risk=self.effect)

    @property
    def is_write(self):
        return self.operation != "Read"

    def listing(self):
        item = {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": self.input_schema,
            "annotations": {
                "title": self.title,
                "readOnlyHint": self.effect == "read",
                "destructiveHint": self.effect == "destructive",
                "idempotentHint": self.idempotent,
                "openWorldHint": False,
            },
        }
        if self.output_schema is not None:
            item["outputSchema"] = self.output_schema
        return item


@dataclass
class Resource:
    uri: str
    name: str
    description: str
    mime_type: str
    securable: str
    operation: str
    reader: object
    catalogue: str = DEFAULT_CATALOGUE

    def listing(self):
        return {"uri": self.uri, "name": self.name, "description": self.description, "mimeType": self.mime_type}


@dataclass
class Prompt:
    name: str
    description: str
    arguments: list  # [{"name", "description", "required", "enum"?}]
    render: object  # render(args: dict of normalised values) -> str
    catalogue: str = DEFAULT_CATALOGUE

    def listing(self):
        return {"name": self.name, "description": self.description,
                "arguments": [{k: a[k] for k in ("name", "description", "required") if k in a} for a in self.arguments]}


@dataclass
class Catalogue:
    name: str
    tools: dict = field(default_factory=dict)
    resources: dict = field(default_factory=dict)
    prompts: dict = field(default_factory=dict)
    duplicates: list = field(default_factory=list)
    server_name: str = "yuzu-server"
    instructions: str = ""
    audiences: tuple = ("api",)  # which token audiences may call this catalogue's endpoint


def configure(name, *, server_name=None, instructions=None, audiences=None):
    """An app describes the endpoint serving its catalogue (the primer clients get on initialize)."""
    cat = _cat(name)
    if server_name is not None:
        cat.server_name = server_name
    if instructions is not None:
        cat.instructions = instructions
    if audiences is not None:
        cat.audiences = tuple(audiences)
    return cat


_catalogues: dict = {}


def catalogue(name=DEFAULT_CATALOGUE):
    autodiscover()
    return _catalogues.setdefault(name, Catalogue(name))


def _cat(name):
    return _catalogues.setdefault(name, Catalogue(name))


def tool(*, name, title, description, securable, operation, input_schema, output_schema=None, effect=None,
         idempotent=None, service_scope="denied", rbac=True, object_permission=None, catalogue=DEFAULT_CATALOGUE,
         poll=False, precondition=None, prepare=None, progress=False):
    def register(fn):
        eff = effect or ("read" if operation == "Read" else "destructive")
        t = Tool(name=name, title=title, description=description, securable=securable, operation=operation,
                 input_schema=input_schema, output_schema=output_schema, handler=fn, effect=eff,
                 idempotent=(operation == "Read") if idempotent is None else idempotent,
                 service_scope=service_scope, rbac=rbac, object_permission=object_permission, catalogue=catalogue,
                 poll=poll, precondition=precondition, prepare=prepare, progress=progress, module=fn.__module__)
        cat = _cat(catalogue)
        if name in cat.tools and cat.tools[name].module != t.module:
            cat.duplicates.append(name)
        cat.tools[name] = t
        return fn

    return register


def resource(*, uri, name, description, securable="Infrastructure", operation="Read", mime_type="application/json",
             catalogue=DEFAULT_CATALOGUE):
    def register(fn):
        _cat(catalogue).resources[uri] = Resource(uri, name, description, mime_type, securable, operation, fn, catalogue)
        return fn

    return register


def prompt(*, name, description, arguments=(), catalogue=DEFAULT_CATALOGUE):
    def register(fn):
        _cat(catalogue).prompts[name] = Prompt(name, description, list(arguments), fn, catalogue)
        return fn

    return register


_discovered = False


def autodiscover():
    global _discovered
    if _discovered:
        return
    _discovered = True
    for config in apps.get_app_configs():
        try:
            importlib.import_module(f"{config.name}.mcp_tools")
        except ModuleNotFoundError as exc:
            if exc.name != f"{config.name}.mcp_tools":
                raise
