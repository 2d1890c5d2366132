"""Test helpers for the bridge that need no real agent (spec §8).

``python -m bridge.testing.standin`` runs the stand-in agent: a small scripted
program for real tmux panes that behaves enough like a coding agent (prompt,
working/idle title, "esc to interrupt", bridge_reply/bridge_ask over MCP) for
the bridge's delivery and rendezvous paths to be tested end to end.
"""
