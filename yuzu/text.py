"""Text a person reads to decide something: the characters that can hide or reorder what they see.

C0 and C1 control characters (terminal escapes, BEL, NUL, DEL) and the Unicode bidirectional controls (U+202A–U+202E
embeddings and overrides, U+2066–U+2069 isolates, U+200E/U+200F marks, U+061C) change how the text around them is
shown: U+202E (RIGHT-TO-LEFT OVERRIDE) in a token name made a browser show the approval page's own words after it
reversed. ``label_problem`` refuses them in a label a caller names (one rule for every such input); ``visible``
shows them, where text a submitter controls is rendered for an approver, as ``<U+202E>``."""

import re

from django.core.exceptions import ValidationError

HIDDEN_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_LAYOUT = frozenset("\n\t")  # kept by visible(multiline=True): an indented JSON document's own layout


def _shown(match: re.Match[str]) -> str:
    return f"<U+{ord(match.group()):04X}>"


def visible(text: object, *, multiline: bool = False) -> str:
    """``text`` with every control and bidi character replaced by its visible name (``<U+202E>``); with
    ``multiline``, newlines and tabs stay."""
    text = "" if text is None else str(text)
    if multiline:
        return HIDDEN_RE.sub(lambda m: m.group() if m.group() in _LAYOUT else _shown(m), text)
    return HIDDEN_RE.sub(_shown, text)


def check_label(field: str, value: object, limit: int) -> str:
    """A label a caller names (an API token's name): 1..``limit`` characters, no control or bidi characters.
    Raises ValidationError (REST 400, MCP -32602) naming the first offending character."""
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ValidationError({field: f"{field} is required, at most {limit} characters"})
    hidden = HIDDEN_RE.search(value)
    if hidden:
        raise ValidationError({field: f"{field} may not contain control or bidirectional-override characters "
                                      f"(found U+{ord(hidden.group()):04X})"})
    return value
