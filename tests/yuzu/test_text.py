"""yuzu.text: the characters that hide or reorder what a person reads are named (``visible``) or refused
(``check_label``); everything a person can see — printable ASCII, letters, marks and spaces of every script — is
left exactly as it is. Pure logic: no database."""

import string
import sys
import unicodedata

import pytest
from django.core.exceptions import ValidationError

from yuzu.text import HIDDEN_RE, check_label, visible

#: the categories that draw nothing or steer the layout: controls, format characters, lone surrogates, line and
#: paragraph separators
HIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}
INVISIBLE = {
    "\u200b": "ZERO WIDTH SPACE", "\u200c": "ZERO WIDTH NON-JOINER", "\u200d": "ZERO WIDTH JOINER",
    "\u2060": "WORD JOINER", "\u2061": "FUNCTION APPLICATION", "\u2062": "INVISIBLE TIMES",
    "\u2063": "INVISIBLE SEPARATOR", "\u2064": "INVISIBLE PLUS", "\ufeff": "ZERO WIDTH NO-BREAK SPACE",
    "\u00ad": "SOFT HYPHEN", "\u034f": "COMBINING GRAPHEME JOINER", "\u180e": "MONGOLIAN VOWEL SEPARATOR",
    "\ufe0f": "VARIATION SELECTOR-16", "\U000e0100": "VARIATION SELECTOR-17", "\U000e0001": "LANGUAGE TAG",
    "\U000e0041": "TAG LATIN CAPITAL LETTER A", "\U000e007f": "CANCEL TAG", "\u3164": "HANGUL FILLER",
    "\u115f": "HANGUL CHOSEONG FILLER", "\uffa0": "HALFWIDTH HANGUL FILLER", "\u2028": "LINE SEPARATOR",
    "\u2029": "PARAGRAPH SEPARATOR", "\ufff9": "INTERLINEAR ANNOTATION ANCHOR",
}


def test_every_control_format_surrogate_and_separator_character_of_this_pythons_unicode_is_hidden():
    """HIDDEN_RE is written out as ranges (computing it at import cost half a second); it must stay a superset of
    the Unicode tables of whatever Python runs it."""
    missed = [f"U+{c:04X}" for c in range(sys.maxunicode + 1)
              if unicodedata.category(chr(c)) in HIDDEN_CATEGORIES and not HIDDEN_RE.fullmatch(chr(c))]
    assert not missed, missed[:20]


@pytest.mark.parametrize("char", list(INVISIBLE), ids=list(INVISIBLE.values()))
def test_an_invisible_character_is_shown_by_its_code_point(char):
    name = f"<U+{ord(char):04X}>"
    assert visible(f"db-{char}1") == f"db-{name}1"
    assert visible(f"db-{char}1", multiline=True) == f"db-{name}1"
    with pytest.raises(ValidationError, match=f"U\\+{ord(char):04X}"):
        check_label("name", f"db-{char}1", 64)


def test_a_tag_character_sentence_is_spelled_out():
    """The tag block mirrors ASCII invisibly: 'ok' followed by tag characters carries a hidden sentence."""
    smuggled = "ok" + "".join(chr(0xE0000 + ord(c)) for c in "approve")
    assert visible(smuggled) == "ok<U+E0061><U+E0070><U+E0070><U+E0072><U+E006F><U+E0076><U+E0065>"


def test_printable_ascii_and_visible_text_of_every_script_stay_untouched():
    ascii_text = string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "")
    assert visible(ascii_text, multiline=True) == ascii_text
    printable = "".join(chr(c) for c in range(0x20, 0x7F))
    assert visible(printable) == printable
    assert check_label("name", printable[:64], 64) == printable[:64]
    for text in ("café résumé", "Сервер-1", "データベース", "שרת", "خادم", "e\u0301", "a\u00a0b\u2003c", "👍",
                 "１２３", "ǅ"):
        assert visible(text) == text, text
        assert check_label("name", text, 64) == text


def test_multiline_keeps_only_newline_and_tab():
    assert visible("a\nb\tc\rd\u2028e", multiline=True) == "a\nb\tc<U+000D>d<U+2028>e"
    assert visible("a\nb\tc") == "a<U+000A>b<U+0009>c"
