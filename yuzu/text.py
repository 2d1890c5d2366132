"""Text a person reads to decide something: the characters that can hide or reorder what they see.

C0 and C1 control characters (terminal escapes, BEL, NUL, DEL) and the Unicode bidirectional controls (U+202A–U+202E
embeddings and overrides, U+2066–U+2069 isolates, U+200E/U+200F marks, U+061C) change how the text around them is
shown: U+202E (RIGHT-TO-LEFT OVERRIDE) in a token name made a browser show the approval page's own words after it
reversed. The invisible ones hide instead: a zero-width space (U+200B) or joiner (U+200D), a word joiner (U+2060), a
byte-order mark (U+FEFF), a soft hyphen (U+00AD), a variation selector (U+FE0F) or a tag character (U+E0041, the
block that smuggles whole ASCII sentences past a reader) made ``db-1`` and ``db-<U+200B>1`` two names an approver
could not tell apart. ``HIDDEN_RE`` matches all of them: every character of the Unicode general categories Cc, Cf,
Cs (lone surrogates), Zl and Zp, and every Default_Ignorable_Code_Point (variation selectors, Hangul fillers, the
tag block) — the set ``tests/yuzu/test_text.py`` checks against this Python's ``unicodedata``. Printable ASCII,
letters, marks and spaces of every script are left alone (homoglyphs are letters: they are not hidden, and refusing
them would refuse every language). ``check_label`` refuses them in a label a caller names (one rule for every such
input); ``visible`` shows them, where text a submitter or an agent controls is rendered for an approver, as
``<U+200B>``."""

import re
from collections.abc import Iterable

from django.core.exceptions import ValidationError

#: Cc, Cf, Cs, Zl, Zp (Unicode 15.1) and Default_Ignorable_Code_Point, as ranges: computed from ``unicodedata`` at
#: import it cost half a second of every start; the test keeps it a superset of this Python's tables
HIDDEN_RE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160"
    "\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ud800-\udfff\ufe00-\ufe0f"
    "\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]")
_LAYOUT = frozenset("\n\t")  # kept by visible(multiline=True): an indented JSON document's own layout


def _shown(match: re.Match[str]) -> str:
    return f"<U+{ord(match.group()):04X}>"


def visible(text: object, *, multiline: bool = False) -> str:
    """``text`` with every control, bidi and invisible character (``HIDDEN_RE``) replaced by its visible name
    (``<U+202E>``, ``<U+200B>``, ``<U+E0041>``); with ``multiline``, newlines and tabs stay."""
    text = "" if text is None else str(text)
    if multiline:
        return HIDDEN_RE.sub(lambda m: m.group() if m.group() in _LAYOUT else _shown(m), text)
    return HIDDEN_RE.sub(_shown, text)


#: a scheme (``https://``, ``ftp://``, ``slack://``) and a dot that joins a host name's labels (a label starts with a
#: letter: every top-level domain does, a version number's parts do not); 。．｡ are dots to IDNA
_SCHEME_RE = re.compile(r"\b([a-z][a-z0-9+.-]*)://", re.IGNORECASE)
_HOST_DOT_RE = re.compile(r"(?<=\S)[.\u3002\uff0e\uff61](?=[^\W\d_])")


def _scheme(match: re.Match[str]) -> str:
    scheme = match.group(1)
    if scheme.lower() in ("http", "https"):
        scheme = scheme[0] + ("XX" if scheme[1:3].isupper() else "xx") + scheme[3:]
    return f"{scheme}[://]"


def defang(text: str) -> str:
    """``text`` with its URLs and host names defanged the way security teams share indicators of compromise —
    ``hxxps[://]evil[.]example/login``, ``www[.]evil[.]example``, ``bob@mail[.]example`` — so that no chat or mail
    client (Slack, Teams, Outlook, Gmail link plain URLs and bare host names) turns text someone else wrote into a
    link, while a person still reads where it points. Version numbers and IPv4 addresses (no label starts with a
    letter) stay as they are. For submitter-controlled text in notifications (approvals.notify), never for data."""
    return _HOST_DOT_RE.sub("[.]", _SCHEME_RE.sub(_scheme, text))


def holds_hidden(value: object) -> bool:
    """Whether a JSON-able value (its strings, its keys, at any depth) holds a ``HIDDEN_RE`` character."""
    if isinstance(value, str):
        return HIDDEN_RE.search(value) is not None
    if isinstance(value, dict):
        return any(holds_hidden(k) or holds_hidden(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(holds_hidden(v) for v in value)
    return False


def hidden_fields(record: dict[str, object], fields: Iterable[str]) -> list[str]:
    """The names of ``fields`` of ``record`` that hold hidden characters, sorted: the flag an API answer carries
    next to the raw text (docs/approvals.md#hidden-characters)."""
    return sorted(f for f in fields if holds_hidden(record.get(f)))


def check_label(field: str, value: object, limit: int) -> str:
    """A label a caller names (an API token's name): 1..``limit`` characters, no control, bidi or invisible
    characters (``HIDDEN_RE``).
    Raises ValidationError (REST 400, MCP -32602) naming the first offending character."""
    if not isinstance(value, str) or not value or len(value) > limit:
        raise ValidationError({field: f"{field} is required, at most {limit} characters"})
    hidden = HIDDEN_RE.search(value)
    if hidden:
        raise ValidationError({field: f"{field} may not contain control or bidirectional-override characters, "
                                      f"nor invisible ones (found U+{ord(hidden.group()):04X})"})
    return value
