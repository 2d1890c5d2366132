"""yuzu settings: everything comes from the environment.

Embedded default (nothing set): SQLite in WAL mode under var/, the in-memory channel layer and Celery
tasks run in-process. ``YUZU_DATABASE_URL=postgres://…`` switches to PostgreSQL (psycopg 3);
``YUZU_REDIS_URL=redis://…`` switches to the channels-redis layer and Celery's Redis broker, with
separate worker processes.
"""

import ipaddress
import logging
import os
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

# Django's generic classes (ModelAdmin[Role], …) subscriptable at run time, as their type stubs have them.
django_stubs_ext.monkeypatch(include_builtins=False)

BASE_DIR = Path(__file__).resolve().parent.parent
# var/ holds the embedded database (sessions, TOTP seeds, bridge profile environments) and the secret key:
# yuzu creates it 0700 and every file it puts there 0600, by explicit modes rather than a process umask (a
# umask would be inherited by what these processes start: bridge workers in tmux, the agent's commands).
# An existing install looser than that is reported by the yuzu.W001 system check, not changed.
VAR_DIR = Path(os.environ.get("YUZU_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)


def private_file(path: str | os.PathLike[str], content: str | None = None) -> None:
    """Create ``path`` with mode 0600 (and ``content``) unless it exists; an existing file is left as it is."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(content or "")


def env_flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def _secret_key() -> str:
    key = os.environ.get("YUZU_SECRET_KEY")
    if key:
        return key
    # Embedded mode: a per-install random key kept under var/, never in the repository.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        private_file(path, secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = _secret_key()
# Key-encryption keys of the secrets at rest (yuzu.secrets): files, never the database. Every server process
# must see the same directory; back it up with the database (docs/governance.md).
YUZU_KEK_DIR = Path(os.environ.get("YUZU_KEK_DIR", VAR_DIR / "keys"))
DEBUG = env_flag("YUZU_DEBUG")
YUZU_BIND = os.environ.get("YUZU_BIND", "127.0.0.1:8000")
#: server (daphne) processes `serve` runs on the one port; 0: one per core with Redis, 1 in embedded mode
YUZU_SERVE_PROCESSES = int(os.environ.get("YUZU_SERVE_PROCESSES", "0") or 0)
#: `serve` pins each daphne to a CPU of its own (docs/running.md); YUZU_SERVE_PIN=0 leaves placement to the kernel
YUZU_SERVE_PIN = env_flag("YUZU_SERVE_PIN", True)
YUZU_BRIDGE_URL = os.environ.get("YUZU_BRIDGE_URL", f"http://{YUZU_BIND}/mcp/bridge/")
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("YUZU_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h.strip()]
# Origins a browser-based MCP client may send; empty Origin (CLI clients) is always fine.
YUZU_ALLOWED_ORIGINS = [
    o.strip()
    for o in os.environ.get("YUZU_ALLOWED_ORIGINS", "").split(",")
    if o.strip()
]
CSRF_TRUSTED_ORIGINS = YUZU_ALLOWED_ORIGINS

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_otp",  # its TOTP plugin is not installed: yuzu.models.TOTPDevice seals the seed its device kept in clear
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served from pinned static files: no CDN, works offline
    "channels",
    "yuzu",
    "mcp.apps.McpConfig",
    "fleet",
    "approvals",
    "pki",
    "bridge",
    "compliance",
    "operations",
    "dex",
    "governance",
    "oauth.apps.ClientsConfig",  # django-oauth-toolkit, under a name that says what it holds
    "oauth",
]

MIDDLEWARE = [
    "yuzu.middleware.CorrelationMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "yuzu.middleware.NulGuardMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "yuzu.middleware.MetricsMiddleware",
]
# /api/ requests go through the same list less what only the admin's pages use: the session, CSRF cookie, user,
# OTP device and messages machinery. The REST face authenticates for itself (yuzu.api.auth: a token, or the
# OTP-verified admin session read by yuzu.auth with DRF enforcing CSRF) and never reads request.user or messages.
# About a twentieth of a GET /api/v1/agents (yuzu/lanes.py).
API_MIDDLEWARE = [m for m in MIDDLEWARE if m not in {
    "django.contrib.sessions.middleware.SessionMiddleware", "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware", "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware"}]

ROOT_URLCONF = "yuzu.urls"
ASGI_APPLICATION = "yuzu.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "approvals.context.pending_count",
            ],
        },
    },
]

SQLITE_SYNCHRONOUS = os.environ.get("YUZU_SQLITE_SYNCHRONOUS", "NORMAL").upper()
if SQLITE_SYNCHRONOUS not in ("NORMAL", "FULL"):
    raise ImproperlyConfigured("YUZU_SQLITE_SYNCHRONOUS must be NORMAL or FULL")
DATABASE_URL = os.environ.get("YUZU_DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # the same, with a kept connection's health check made without a round trip (yuzu/backends/postgresql)
        DATABASES["default"]["ENGINE"] = "yuzu.backends.postgresql"
        # Parameters bound by the server, not quoted into the SQL text by psycopg, and a statement a connection has
        # run five times prepared: PostgreSQL then parses, analyses and plans the auth version, the list and the
        # audit INSERT once per connection instead of on every call (bench/mcp_calls, tenth round: tools/call
        # 1.15x-1.22x at 16 connections, PostgreSQL's and Redis's CPU per call down by a third). A pooler in
        # transaction mode must keep prepared statements per client (docs/running.md).
        DATABASES["default"].setdefault("OPTIONS", {}).update(server_side_binding=True, prepare_threshold=5)
    if os.environ.get("YUZU_TEST_DATABASE_NAME"):
        DATABASES["default"]["TEST"] = {"NAME": os.environ["YUZU_TEST_DATABASE_NAME"]}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("YUZU_SQLITE_PATH", str(VAR_DIR / "yuzu.sqlite3")),
            # Keep connections: opening one (and checkpointing the WAL on close) per request costs more
            # than the request itself.
            "CONN_MAX_AGE": 600,
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                # NORMAL: a commit is durable once the WAL is checkpointed; FULL: at once (an fsync per commit).
                # A volume that fails under the server (or a power cut) loses NORMAL's last commits: see
                # docs/operations.md "Embedded database: disk full or read-only".
                "init_command": f"PRAGMA journal_mode=WAL; PRAGMA synchronous={SQLITE_SYNCHRONOUS};",
            },
            # A file, not :memory:, so server processes started by the tests share it.
            "TEST": {"NAME": str(VAR_DIR / "test_yuzu.sqlite3")},
        }
    }
DATABASE_IS_POSTGRES = DATABASES["default"]["ENGINE"].endswith("postgresql")
SQLITE_FILE = None  # the embedded database's file, when there is one
if DATABASES["default"]["ENGINE"].endswith("sqlite3") and not DATABASES["default"]["NAME"].startswith((":", "file:")):
    SQLITE_FILE = Path(DATABASES["default"]["NAME"])
    if SQLITE_FILE.parent.is_dir():
        # Created empty and private before SQLite first opens it: its -wal and -shm files take the same mode.
        private_file(SQLITE_FILE)

REDIS_URL = os.environ.get("YUZU_REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels-redis's layer plus a batched fan-out (group_send_many, yuzu/channel_layer.py)
            "BACKEND": "yuzu.channel_layer.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "capacity": 5000, "expiry": 60},
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_TASK_ALWAYS_EAGER = False
else:
    # Channels' InMemoryChannelLayer sweeps the whole layer on every group send and receive (O(N²) fan-out):
    # yuzu's own in-process layer sweeps once a second instead (yuzu/channel_layer.py).
    CHANNEL_LAYERS = {"default": {"BACKEND": "yuzu.channel_layer.LocalChannelLayer"}}
    CELERY_BROKER_URL = "memory://"
    # Embedded mode: tasks run in-process, so nothing else must be installed.
    CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {  # Celery's own entry format: task, schedule, args …
    "sweep-overdue-executions": {"task": "fleet.tasks.sweep_overdue", "schedule": 5.0},
    "reap-guardian-events": {"task": "compliance.tasks.reap_guardian_events", "schedule": 3600.0},
    "refresh-crl": {"task": "pki.tasks.refresh_crl", "schedule": 3600.0},  # docs/pki.md
    "dex-rollup": {"task": "dex.tasks.rollup_app_perf", "schedule": 900.0},  # docs/dex.md
    "dex-reap": {"task": "dex.tasks.reap", "schedule": 3600.0},
    "sweep-engine-rotations": {"task": "governance.tasks.sweep_engine_rotations", "schedule": 60.0},  # governance.md
}
# Instruction schedules (docs/operator.md): the tick; with Redis a Celery beat task, embedded on the server's loop.
YUZU_SCHEDULE_TICK_S = float(os.environ.get("YUZU_SCHEDULE_TICK_S", "30"))
if REDIS_URL:
    CELERY_BEAT_SCHEDULE["run-schedules"] = {"task": "operations.tasks.run_schedules",
                                             "schedule": YUZU_SCHEDULE_TICK_S}
YUZU_UPLOAD_DIR = os.environ.get("YUZU_UPLOAD_DIR") or str(VAR_DIR / "uploads")
# Compliance (docs/compliance.md): the evaluator's tick, its grace window for answers, and how long the
# fleet-wide counts are cached. With Redis the tick is a Celery beat task; embedded, it runs on the server's
# event loop (compliance.receivers), where the in-memory channel layer reaches the agents.
YUZU_COMPLIANCE_TICK_S = float(os.environ.get("YUZU_COMPLIANCE_TICK_S", "10"))
if REDIS_URL:
    CELERY_BEAT_SCHEDULE["evaluate-policies"] = {"task": "compliance.tasks.evaluate_policies",
                                                 "schedule": YUZU_COMPLIANCE_TICK_S}
YUZU_COMPLIANCE_GRACE_S = float(os.environ.get("YUZU_COMPLIANCE_GRACE_S", "15"))
YUZU_COMPLIANCE_CACHE_S = int(os.environ.get("YUZU_COMPLIANCE_CACHE_S", "60"))
YUZU_GUARDIAN_EVENT_RETENTION_DAYS = int(os.environ.get("YUZU_GUARDIAN_EVENT_RETENTION_DAYS", "30"))
# Seconds between agent heartbeats (fleet.models.heartbeat_interval; docs/fleet.md), and so between DEX facts.
YUZU_AGENT_HEARTBEAT_S = int(os.environ.get("YUZU_AGENT_HEARTBEAT_S", "30"))
# DEX (docs/dex.md): how long signal observations are kept, and the blast-radius alert's tuning.
YUZU_DEX_SIGNAL_RETENTION_DAYS = int(os.environ.get("YUZU_DEX_SIGNAL_RETENTION_DAYS", "30"))
# ... how many observations and app-perf frames one agent may have stored a minute, per server process: past it the
# rest are dropped and counted (dex.ingest). An agent debounces each observation for an hour and sends its app
# summary hourly (procperf_send_s), so these are for a hostile one.
YUZU_DEX_OBSERVATIONS_PER_MINUTE = max(1, int(os.environ.get("YUZU_DEX_OBSERVATIONS_PER_MINUTE", "300")))
YUZU_DEX_APP_PERF_FRAMES_PER_MINUTE = max(1, int(os.environ.get("YUZU_DEX_APP_PERF_FRAMES_PER_MINUTE", "6")))
# ... and how many rows one agent may keep, whatever their age: past it its oldest go as new ones come (dex.ingest).
# 10,000 observations is 330 a day for 30 days (an agent debounces each (type, subject) for an hour); 20,000 app rows
# is 31 days of an agent's 500-row daily summary with room to spare.
YUZU_DEX_OBSERVATIONS_PER_AGENT = max(1, int(os.environ.get("YUZU_DEX_OBSERVATIONS_PER_AGENT", "10000")))
YUZU_DEX_APP_ROWS_PER_AGENT = max(1, int(os.environ.get("YUZU_DEX_APP_ROWS_PER_AGENT", "20000")))
YUZU_DEX_BLAST_DEVICES = int(os.environ.get("YUZU_DEX_BLAST_DEVICES", "5"))
YUZU_DEX_BLAST_WINDOW_S = int(os.environ.get("YUZU_DEX_BLAST_WINDOW_S", "900"))
YUZU_DEX_BLAST_COOLDOWN_S = int(os.environ.get("YUZU_DEX_BLAST_COOLDOWN_S", "3600"))

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024
LOGIN_URL = "/admin/login/"
LOGIN_REDIRECT_URL = "/admin/"  # where a sign-in lands when its next= is missing or unsafe (not Django's /accounts/profile/)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
OTP_TOTP_ISSUER = "yuzu"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["yuzu.api.auth.YuzuAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["yuzu.api.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["yuzu.api.parsers.StrictJSONParser"],
    "EXCEPTION_HANDLER": "yuzu.api.envelope.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "yuzu API",
    "DESCRIPTION": "REST face of yuzu: tokens, RBAC, management groups, audit, fleet, approvals, bridge.",
    "VERSION": "v1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None, "tryItOutEnabled": False},
    "OAS_VERSION": "3.1.0",  # the tool schemas are JSON Schema 2020-12 (type: [x, "null"])
    "COMPONENT_SPLIT_REQUEST": False,
}

# Approval notifications (docs/approvals.md#notifications). Links in them point at YUZU_PUBLIC_URL.
YUZU_PUBLIC_URL = os.environ.get("YUZU_PUBLIC_URL", f"http://{YUZU_BIND}").rstrip("/")
# Served over TLS (YUZU_PUBLIC_URL https://…, a TLS proxy in front): the admin's session and CSRF cookies go over
# HTTPS only — the session cookie is a signed-in admin's credential, and a browser sent it over plain HTTP to any
# http:// link to the host. YUZU_COOKIE_SECURE=0/1 overrides.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_flag("YUZU_COOKIE_SECURE", YUZU_PUBLIC_URL.startswith("https://"))
# Django's email settings, from YUZU_EMAIL_*. Email notifications are on once a mail server (or a backend)
# is configured; YUZU_APPROVAL_EMAIL=0/1 forces them off/on.
EMAIL_BACKEND = os.environ.get("YUZU_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = os.environ.get("YUZU_EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("YUZU_EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("YUZU_EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("YUZU_EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_flag("YUZU_EMAIL_USE_TLS")
EMAIL_USE_SSL = env_flag("YUZU_EMAIL_USE_SSL")
EMAIL_TIMEOUT = float(os.environ.get("YUZU_EMAIL_TIMEOUT", "10"))
DEFAULT_FROM_EMAIL = os.environ.get("YUZU_EMAIL_FROM", "yuzu@localhost")
YUZU_APPROVAL_EMAIL = env_flag("YUZU_APPROVAL_EMAIL",
                               bool(os.environ.get("YUZU_EMAIL_HOST") or os.environ.get("YUZU_EMAIL_BACKEND")))
# Send to every active user who may approve globally (superusers, global Approval:Approve roles) ...
YUZU_APPROVAL_EMAIL_APPROVERS = env_flag("YUZU_APPROVAL_EMAIL_APPROVERS", True)
# ... and to these addresses (comma-separated), e.g. a team list.
YUZU_APPROVAL_EMAIL_TO = [a.strip() for a in os.environ.get("YUZU_APPROVAL_EMAIL_TO", "").split(",") if a.strip()]
# A JSON POST per new ticket, signed with HMAC-SHA256 under the shared secret.
YUZU_APPROVAL_WEBHOOK_URL = os.environ.get("YUZU_APPROVAL_WEBHOOK_URL", "").strip()
YUZU_APPROVAL_WEBHOOK_SECRET = os.environ.get("YUZU_APPROVAL_WEBHOOK_SECRET", "")
YUZU_APPROVAL_WEBHOOK_TIMEOUT = float(os.environ.get("YUZU_APPROVAL_WEBHOOK_TIMEOUT", "10"))
# Each notification is tried at most this many times, waiting BACKOFF, 2×BACKOFF, 4×… seconds (≤ 30 min) between.
YUZU_APPROVAL_NOTIFY_ATTEMPTS = int(os.environ.get("YUZU_APPROVAL_NOTIFY_ATTEMPTS", "5"))
YUZU_APPROVAL_NOTIFY_BACKOFF = float(os.environ.get("YUZU_APPROVAL_NOTIFY_BACKOFF", "30"))


def _check_notification_settings() -> None:
    if YUZU_APPROVAL_WEBHOOK_URL:
        url = urlsplit(YUZU_APPROVAL_WEBHOOK_URL)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ImproperlyConfigured("YUZU_APPROVAL_WEBHOOK_URL must be an http:// or https:// URL")
        if len(YUZU_APPROVAL_WEBHOOK_SECRET) < 16:
            raise ImproperlyConfigured("YUZU_APPROVAL_WEBHOOK_SECRET must be set (at least 16 characters) "
                                       "when YUZU_APPROVAL_WEBHOOK_URL is")
    if not 1 <= YUZU_APPROVAL_NOTIFY_ATTEMPTS <= 20:
        raise ImproperlyConfigured("YUZU_APPROVAL_NOTIFY_ATTEMPTS must be between 1 and 20")
    if YUZU_APPROVAL_NOTIFY_BACKOFF < 0 or YUZU_APPROVAL_WEBHOOK_TIMEOUT <= 0:
        raise ImproperlyConfigured("YUZU_APPROVAL_NOTIFY_BACKOFF must be ≥ 0 and YUZU_APPROVAL_WEBHOOK_TIMEOUT > 0")


_check_notification_settings()

# MCP kill switches and transport knobs (docs/mcp.md).
YUZU_MCP_DISABLE = env_flag("YUZU_MCP_DISABLE")
YUZU_MCP_READ_ONLY = env_flag("YUZU_MCP_READ_ONLY")
YUZU_MCP_NO_STREAMING = env_flag("YUZU_MCP_NO_STREAMING")
YUZU_MCP_STREAMED_POST = env_flag("YUZU_MCP_STREAMED_POST", True)


def _max_streams(default: int = 1024, name: str = "YUZU_MCP_MAX_STREAMS") -> int:
    """Held-open GET streams per process (docs/streaming.md): refused past it, never evicted."""
    raw = os.environ.get(name, "").strip()
    try:
        return max(1, int(raw)) if raw else default
    except ValueError:
        logging.getLogger("yuzu.mcp").warning("%s=%r is not an integer; using %d", name, raw, default)
        return default


YUZU_MCP_MAX_STREAMS = _max_streams()
# 2026-07-28 requests (docs/mcp.md "Eras"): tasks a token may hold in progress at once (every process), and
# modern requests a token may have in flight at once in one server process; past either, 429 -32010.
YUZU_MCP_MAX_TASKS = _max_streams(32, "YUZU_MCP_MAX_TASKS")
YUZU_MCP_MODERN_INFLIGHT = _max_streams(16, "YUZU_MCP_MODERN_INFLIGHT")
# A removed test-only switch that made unauthenticated MCP calls act as a user. A server started with it set
# refuses to start rather than leave anyone believing it still does something (the conformance test now
# reaches daphne through a proxy that adds a token: tests/support/auth_proxy.py).
if "YUZU_MCP_TEST_ANONYMOUS_USER" in os.environ:
    raise ImproperlyConfigured("YUZU_MCP_TEST_ANONYMOUS_USER is no longer supported: every MCP call needs a token "
                               "(see docs/mcp-conformance.md); unset it")

# OAuth 2.1 for MCP clients (docs/oauth.md): yuzu is its own authorization server, on django-oauth-toolkit.
# The issuer and the MCP endpoints' resource URIs are YUZU_PUBLIC_URL's when it is set (do set it behind a
# TLS proxy), else the request's own scheme and host.
YUZU_OAUTH_ISSUER = os.environ.get("YUZU_PUBLIC_URL", "").strip().rstrip("/")
# How long one access token lives; the client refreshes it until the consented expiry (at most 90 days).
YUZU_OAUTH_ACCESS_TOKEN_SECONDS = int(os.environ.get("YUZU_OAUTH_ACCESS_TOKEN_SECONDS", "3600"))
# Client registrations (dynamic, and first sight of a client metadata document) per client address and in all,
# per hour and server process.
YUZU_OAUTH_REGISTRATIONS_PER_HOUR = int(os.environ.get("YUZU_OAUTH_REGISTRATIONS_PER_HOUR", "20"))
YUZU_OAUTH_REGISTRATIONS_PER_HOUR_TOTAL = int(os.environ.get("YUZU_OAUTH_REGISTRATIONS_PER_HOUR_TOTAL", "200"))
# Client metadata documents are fetched only from public addresses; these networks (CIDRs, comma-separated)
# are allowed as well, e.g. an internal client's 10.0.0.0/8. Cloud metadata addresses never are.
YUZU_OAUTH_CIMD_ALLOWED_NETWORKS = os.environ.get("YUZU_OAUTH_CIMD_ALLOWED_NETWORKS", "")


def _check_oauth_settings() -> None:
    for net in filter(None, (n.strip() for n in YUZU_OAUTH_CIMD_ALLOWED_NETWORKS.split(","))):
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            raise ImproperlyConfigured(f"YUZU_OAUTH_CIMD_ALLOWED_NETWORKS: {net!r} is not a network (e.g. 10.0.0.0/8)") from None
    if not 60 <= YUZU_OAUTH_ACCESS_TOKEN_SECONDS <= 86400:
        raise ImproperlyConfigured("YUZU_OAUTH_ACCESS_TOKEN_SECONDS must be between 60 and 86400")
    if YUZU_OAUTH_ISSUER and not YUZU_OAUTH_ISSUER.startswith(("http://", "https://")):
        raise ImproperlyConfigured("YUZU_PUBLIC_URL must be an http:// or https:// URL")


_check_oauth_settings()

OAUTH2_PROVIDER_APPLICATION_MODEL = "oauth2_provider.Application"  # the (unswapped) model oauth's tables refer to
OAUTH2_PROVIDER = {
    "OAUTH2_SERVER_CLASS": "oauth.server.Server",
    "OAUTH2_VALIDATOR_CLASS": "oauth.validators.Validator",
    # An MCP tier is a scope; a client that names none asks for the highest, which the consent page lowers.
    "SCOPES": {"mcp:readonly": "read tools only", "mcp:operator": "reads and routine operations",
               "mcp:supervised": "everything your roles allow, risky calls after a human approval"},
    "DEFAULT_SCOPES": ["mcp:supervised"],
    "PKCE_REQUIRED": True,
    "AUTHORIZATION_CODE_EXPIRE_SECONDS": 60,
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "REFRESH_TOKEN_GRACE_PERIOD_SECONDS": 0,
    "ALLOWED_REDIRECT_URI_SCHEMES": ["http", "https"],
    "ALLOW_URI_WILDCARDS": False,
    "OIDC_ISS_ENDPOINT": YUZU_OAUTH_ISSUER,
    "CIMD_ENABLED": True,
    "CIMD_METADATA_FETCHER": "oauth.cimd.Fetcher",
    "CIMD_FETCH_TIMEOUT_SECONDS": 5,
    "CIMD_MAX_DOCUMENT_SIZE": 16 * 1024,
    "CIMD_FAILURE_BACKOFF_SECONDS": 60,
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,
    "COMPLIANT_BCP_RFC9700_REFRESH_TOKEN": True,
    # http stays allowed for native clients' loopback callbacks (RFC 8252); yuzu refuses it for any other host.
    "COMPLIANT_BCP_RFC9700_REDIRECT_URI_SCHEME": False,
    "COMPLIANT_BCP_RFC9700_REDIRECT_URI_MATCHING": True,
    "COMPLIANT_BCP_RFC9700_PKCE_REQUIRED": True,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("YUZU_LOG_LEVEL", "INFO")},
    "loggers": {"django.request": {"level": "ERROR"}, "daphne": {"level": "WARNING"},
                # Their debug lines carry codes and refresh tokens: never below INFO, whatever YUZU_LOG_LEVEL says.
                "oauthlib": {"level": "INFO"}, "oauth2_provider": {"level": "INFO"}},
}

AUTHENTICATION_BACKENDS = ["yuzu.accounts.LockingBackend"]
