"""The REST envelope: ``{data, meta}`` on success, ``{error:{code, message, correlation_id,
retry_after_ms, remediation, permission?}, meta}`` on failure, ``X-Correlation-Id`` on both."""

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest
from rest_framework import exceptions as drf
from rest_framework.request import Request
from rest_framework.response import Response

from yuzu.errors import YuzuError, correlation_id, invalid_input, validation_message
from yuzu.faults import store_fault
from yuzu.jsondata import JsonObject
from yuzu.middleware import request_cid

log = logging.getLogger("yuzu.api")
META = {"api_version": "v1"}


def cid_of(request: Request | HttpRequest) -> str:
    return request_cid(request._request if isinstance(request, Request) else request)


def ok(data: object, status: int = 200, **meta: object) -> Response:
    return Response({"data": data, "meta": {**META, **meta}}, status=status)


def error_body(status: int, message: str, cid: str, *, retry_after_ms: int | None = None,
               remediation: str | None = None, **extra: object) -> JsonObject:
    err: JsonObject = {"code": status, "message": message, "correlation_id": cid, "retry_after_ms": retry_after_ms,
           "remediation": remediation}
    err.update({k: v for k, v in extra.items() if v is not None})
    return {"error": err, "meta": META}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    request = context.get("request")
    cid = cid_of(request) if request is not None else correlation_id()
    headers: dict[str, str] = {}
    status: int
    if isinstance(exc, YuzuError):
        status, body = exc.status, error_body(exc.status, exc.message, cid, retry_after_ms=exc.retry_after_ms,
                                              remediation=exc.remediation, permission=exc.permission, **exc.extra)
    elif isinstance(exc, DjangoValidationError):
        err = invalid_input(exc)
        status, body = 400, error_body(400, err.message, cid, remediation=err.remediation)
    elif isinstance(exc, RequestDataTooBig):
        status, body = 413, error_body(413, "request body exceeds 4 MiB", cid)
    elif isinstance(exc, (drf.NotAuthenticated, drf.AuthenticationFailed)):
        status = 401
        body = error_body(401, str(exc.detail), cid, remediation="send Authorization: Bearer yuzu_…")
        headers["WWW-Authenticate"] = 'Bearer realm="yuzu"'
    elif isinstance(exc, drf.ParseError):
        status, body = 400, error_body(400, f"malformed JSON body: {exc.detail}", cid)
    elif isinstance(exc, drf.ValidationError):
        status, body = 400, error_body(400, validation_message(exc.detail), cid, remediation="correct the request and retry")
    elif isinstance(exc, drf.APIException):
        status = exc.status_code
        body = error_body(status, validation_message(exc.detail), cid)
        wait = getattr(exc, "wait", None) if isinstance(exc, drf.Throttled) else None  # seconds (no stub has it)
        if wait:
            body["error"]["retry_after_ms"] = int(wait * 1000)
    elif isinstance(exc, Http404):
        status, body = 404, error_body(404, "not found", cid)
    elif (fault := store_fault(exc, what=f"REST {cid}")) is not None:  # a backing store failed: 503, not 500
        status, body = fault.status, error_body(fault.status, fault.message, cid, retry_after_ms=fault.retry_after_ms,
                                                remediation=fault.remediation, **fault.extra)
        headers["Retry-After"] = str(max(1, (fault.retry_after_ms or 0) // 1000))
    else:
        log.exception("unhandled API error %s", cid)
        status, body = 500, error_body(500, "internal error", cid, remediation="retry; cite the correlation_id if it persists")
    response = Response(body, status=status, headers=headers)
    return response
