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
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict, TypeVar

from django.apps import apps

from yuzu.jsondata import JsonObject
from yuzu.plans import Plan
from yuzu.policy import requires_approval

from .context import ToolContext
from .schema import Schema

if TYPE_CHECKING:
    from yuzu.rbac import Principal

DEFAULT_CATALOGUE = "v1"
EFFECTS = ("read", "additive", "destructive")
SERVICE_SCOPE_CLASSES = ("denied", "confined")
#: a resource is fleet data ("denied" to a service-scoped token, like a tool of that class; none is confined) or a
#: document the same for every caller ("open": the primer, the catalogues, the OpenAPI description)
RESOURCE_SCOPE_CLASSES = ("denied", "open")


class ToolFailure(Exception):
    """A tool's own business failure: answered as a result with ``isError: true``. Its audit row says ``failure``,
    or ``audit_result`` — ``denied`` for a refusal of who the caller is, as the REST face's 403 says."""

    def __init__(self, message: str, data: JsonObject | None = None, *, audit_result: str = "failure") -> None:
        super().__init__(message)
        self.message = message
        self.data = data or {}
        self.audit_result = audit_result


#: a sync handler: the call's structured result
SyncHandler = Callable[[ToolContext, JsonObject], JsonObject]
#: an async handler (``async def``), awaited on the event loop
AsyncHandler = Callable[[ToolContext, JsonObject], Awaitable[JsonObject]]
Handler = SyncHandler | AsyncHandler
H = TypeVar("H", bound=Handler)
#: allows(principal, tool, args) -> bool; it may raise yuzu.errors.YuzuError to say why it refuses
ObjectPermission = Callable[["Principal", "Tool", JsonObject], bool]
#: precondition(ctx, args) -> bool: checked on a gated recall before the ticket is consumed
Precondition = Callable[[ToolContext, JsonObject], bool]
#: reader(ctx) -> the resource's text, or a JSON value sent as its text
Reader = Callable[[ToolContext], object]
R = TypeVar("R", bound=Reader)
#: render(values) -> the prompt's text; values are the arguments normalised (mcp.prompts.render_prompt)
Render = Callable[[dict[str, str | None]], str]
P = TypeVar("P", bound=Render)


@dataclass(frozen=True)
class TaskHooks:
    """How a tool's long-running work is read back as a task (the 2026-07-28 Tasks extension, mcp.tasks):
    ``id_field`` names the work's id in the tool's result; ``state(ctx, id)`` → ("working" | "completed" |
    "cancelled", the structured result a status read returns) and ``cancel(ctx, id)`` run with the caller's own
    permissions; ``groups(id)`` names the channel-layer groups announcing its changes (each raises yuzu.errors.YuzuError — e.g. not found — for work the caller may not see)."""

    id_field: str
    state: Callable[[ToolContext, str], tuple[str, JsonObject]]
    cancel: Callable[[ToolContext, str], object]
    #: groups(id) → the channel-layer groups announcing the work's changes (a subscriptions/listen stream that
    #: follows the task joins them and re-reads ``state`` on each announcement)
    groups: Callable[[str], list[str]] | None = None


class Prepare(Protocol):
    """A tool's one validation: its Plan, or a refusal (yuzu.plans). ``pinned``: what an approval pinned."""

    def __call__(self, ctx: ToolContext, args: JsonObject, /, pinned: JsonObject | None = None) -> Plan[Any]: ...


class PromptArgument(TypedDict):
    name: str
    description: str
    required: bool
    enum: NotRequired[list[str]]  # a closed set: a value outside it is replaced by ``default`` (or the first)
    default: NotRequired[str]


@dataclass
class Tool:
    name: str
    title: str
    description: str
    securable: str
    operation: str
    input_schema: Schema
    output_schema: Schema | None
    handler: Handler
    effect: str = "read"
    idempotent: bool = True
    service_scope: str = "denied"
    rbac: bool = True
    # Object-level permission (DRF's has_object_permission): allows(principal, tool, args) -> bool, declared
    # by the app that owns the object (it may raise yuzu.errors.PermissionDenied to say why it refuses);
    # without it RBAC asks for the permission on any scope.
    object_permission: ObjectPermission | None = None
    catalogue: str = DEFAULT_CATALOGUE
    poll: bool = False
    precondition: Precondition | None = None
    prepare: Prepare | None = None
    # Reads the database and does nothing else (no write, message, cache or call out): may run before the
    # caller's grant is confirmed, the confirmation travelling with its audit row (yuzu.provisional)
    pure: bool = False
    progress: bool = False  # may report notifications/progress (ctx.follow) and stream a POST response
    task: TaskHooks | None = None  # may answer a modern client that declares the Tasks extension with a task
    module: str = ""

    @property
    def is_async(self) -> bool:
        return asyncio.iscoroutinefunction(self.handler)

    @property
    def gate_capable(self) -> bool:
        """Approval-gated on some tier: its schema carries approval_id, which the handler never sees."""
        return any(requires_approval(t, self.securable, self.operation) for t in ("operator", "supervised"))

    def plan(self, ctx: ToolContext, args: JsonObject, pinned: JsonObject | None = None) -> Plan[Any]:
        """The call's Plan: the tool's own ``prepare``, or the arguments as they are."""
        if self.prepare is not None:
            return self.prepare(ctx, args, pinned=pinned)
        return Plan(summary=f"{self.title}", value=args, risk=self.effect)

    @property
    def is_write(self) -> bool:
        return self.operation != "Read"

    def listing(self) -> JsonObject:
        item: JsonObject = {
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
    reader: Reader
    catalogue: str = DEFAULT_CATALOGUE
    service_scope: str = "denied"

    def listing(self) -> JsonObject:
        return {"uri": self.uri, "name": self.name, "description": self.description, "mimeType": self.mime_type}


@dataclass
class Prompt:
    name: str
    description: str
    arguments: list[PromptArgument]
    render: Render
    catalogue: str = DEFAULT_CATALOGUE

    def listing(self) -> JsonObject:
        return {"name": self.name, "description": self.description,
                "arguments": [{"name": a["name"], "description": a["description"], "required": a["required"]}
                              for a in self.arguments]}


@dataclass
class Catalogue:
    name: str
    tools: dict[str, Tool] = field(default_factory=dict)
    resources: dict[str, Resource] = field(default_factory=dict)
    prompts: dict[str, Prompt] = field(default_factory=dict)
    duplicates: list[str] = field(default_factory=list)
    server_name: str = "yuzu-server"
    instructions: str = ""
    audiences: tuple[str, ...] = ("api",)  # which token audiences may call this catalogue's endpoint


def configure(name: str, *, server_name: str | None = None, instructions: str | None = None,
              audiences: Iterable[str] | None = None) -> Catalogue:
    """An app describes the endpoint serving its catalogue (the primer clients get on initialize)."""
    cat = _cat(name)
    if server_name is not None:
        cat.server_name = server_name
    if instructions is not None:
        cat.instructions = instructions
    if audiences is not None:
        cat.audiences = tuple(audiences)
    return cat


_catalogues: dict[str, Catalogue] = {}


def catalogue(name: str = DEFAULT_CATALOGUE) -> Catalogue:
    autodiscover()
    return _catalogues.setdefault(name, Catalogue(name))


def _cat(name: str) -> Catalogue:
    return _catalogues.setdefault(name, Catalogue(name))


def tool(*, name: str, title: str, description: str, securable: str, operation: str, input_schema: Schema,
         output_schema: Schema | None = None, effect: str | None = None, idempotent: bool | None = None,
         service_scope: str = "denied", rbac: bool = True, object_permission: ObjectPermission | None = None,
         catalogue: str = DEFAULT_CATALOGUE, poll: bool = False, precondition: Precondition | None = None,
         prepare: Prepare | None = None, progress: bool = False, task: TaskHooks | None = None,
         pure: bool = False) -> Callable[[H], H]:
    def register(fn: H) -> H:
        eff = effect or ("read" if operation == "Read" else "destructive")
        if pure and eff != "read":
            raise ValueError(f"tool {name}: only a read may be pure")
        t = Tool(name=name, title=title, description=description, securable=securable, operation=operation,
                 input_schema=input_schema, output_schema=output_schema, handler=fn, effect=eff,
                 idempotent=(operation == "Read") if idempotent is None else idempotent,
                 service_scope=service_scope, rbac=rbac, object_permission=object_permission, catalogue=catalogue,
                 poll=poll, precondition=precondition, prepare=prepare, progress=progress, task=task,
                 pure=pure, module=fn.__module__)
        cat = _cat(catalogue)
        if name in cat.tools and cat.tools[name].module != t.module:
            cat.duplicates.append(name)
        cat.tools[name] = t
        return fn

    return register


def resource(*, uri: str, name: str, description: str, securable: str = "Infrastructure", operation: str = "Read",
             mime_type: str = "application/json", catalogue: str = DEFAULT_CATALOGUE,
             service_scope: str = "denied") -> Callable[[R], R]:
    def register(fn: R) -> R:
        _cat(catalogue).resources[uri] = Resource(uri, name, description, mime_type, securable, operation, fn, catalogue,
                                                  service_scope)
        return fn

    return register


def prompt(*, name: str, description: str, arguments: Iterable[PromptArgument] = (),
           catalogue: str = DEFAULT_CATALOGUE) -> Callable[[P], P]:
    def register(fn: P) -> P:
        _cat(catalogue).prompts[name] = Prompt(name, description, list(arguments), fn, catalogue)
        return fn

    return register


_discovered = False


def autodiscover() -> None:
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
