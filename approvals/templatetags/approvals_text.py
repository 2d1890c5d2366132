"""``visible``: submitter-controlled text on an approver's page, its control and bidi characters shown by name
(yuzu.text.visible), so the approver sees exactly what they approve."""

from django import template

from yuzu.text import visible as _visible

register = template.Library()


@register.filter
def visible(value):
    return _visible(value)
