"""The dispatch gates: what may stop a command on its way to agents (operations' plugin kill switches install
theirs). Asked when a command's targets are known (its plan), when it is launched (fleet.executions), and by the
background dispatch before each batch of first sends and each round of re-sends (fleet.tasks), so a switch
engaged while a command is under way stops its sends from then on (docs/fleet.md)."""

from collections.abc import Callable, Sequence
from typing import Any

from yuzu.errors import YuzuError

#: Callables ``(plugin, action, targets, principal)`` installed by other apps in their AppConfig.ready
#: (operations: plugin kill switches): each raises a YuzuError to refuse the whole dispatch (EveryTargetHeld when
#: it refuses only because it holds back every target; a retry hint, ``retry_after_ms``, when it could not tell —
#: a store fault), or returns the targets it holds back ({agent_id: why}), which the dispatch leaves out.
#: ``principal`` is the caller a refusal is said to (None: the server's own dispatch), so that it names only
#: what that caller may read.
DISPATCH_GATES: list[Callable[[str, str, Sequence[str], Any], dict[str, str]]] = []


class EveryTargetHeld(YuzuError):
    """A gate's refusal of a dispatch whose every target it holds back (``held``: {agent_id: why}). A caller
    with the targets already committed (the background dispatch's batch) holds them back instead."""

    def __init__(self, message, held, **options):
        super().__init__(message, **options)
        self.held = held


def dispatch_gate(plugin, action, targets=(), principal=None):
    """The targets held back ({agent_id: why}); raises when the dispatch is refused."""
    held = {}
    for gate in DISPATCH_GATES:
        held.update(gate(plugin, action, targets, principal))
    return held


def held_back(plugin, action, targets):
    """The background dispatch's question, for one batch of targets already committed to the command: the ones
    held back ({agent_id: why}), every one if that is what the gates refuse for; raises when they refuse the
    dispatch as such (a fleet-wide switch) or could not tell (a retry hint)."""
    try:
        return dispatch_gate(plugin, action, targets)
    except EveryTargetHeld as exc:
        return exc.held
