"""Routes to ASGI applications (Channels consumers, Django's ASGI handler) for Channels' URLRouter.

Channels routes ASGI applications with Django's ``path()`` and ``re_path()``, as its documentation does;
django-stubs types those two for views only, and types-channels' URLRouter expects a pattern type of its own.
These are the same functions, typed loosely: the one seam between the two sets of stubs."""

from collections.abc import Callable
from typing import Any

from django.urls import path as _path
from django.urls import re_path as _re_path

path: Callable[..., Any] = _path
re_path: Callable[..., Any] = _re_path
