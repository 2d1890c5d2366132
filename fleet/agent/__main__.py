"""python -m fleet.agent --server ws://127.0.0.1:8000 --token yzd_… [--state-dir DIR] [--config FILE]"""

import argparse
import asyncio
import logging
import os
import sys

from .client import AgentClient, Refused, default_state_dir, load_config


def build_parser(parser=None):
    parser = parser or argparse.ArgumentParser(prog="python -m fleet.agent", description="The yuzu endpoint agent.")
    parser.add_argument("--server", required=True, help="ws:// or wss:// URL of the yuzu server")
    parser.add_argument("--token", default=os.environ.get("YUZU_AGENT_TOKEN"),
                        help="device enrolment token (yzd_…), needed on the first run only")
    parser.add_argument("--state-dir", default=None, help=f"where the identity lives (default {default_state_dir()})")
    parser.add_argument("--config", default=None, help="agent config JSON (default <state-dir>/config.json)")
    parser.add_argument("--dex-disable", action="store_true",
                        help="send no DEX telemetry (heartbeat perf/network facts, signals, app performance)")
    return parser


def run(server, token=None, state_dir=None, config=None, dex_disable=False):
    """Run until interrupted; returns a process exit code."""
    state_dir = state_dir or default_state_dir()
    try:
        settings = load_config(config or os.path.join(state_dir, "config.json"))
        if dex_disable:
            settings["dex_disable"] = True
        client = AgentClient(server, token, state_dir, settings)
        asyncio.run(client.run())
    except Refused as exc:
        logging.getLogger("yuzu.agent").error("stopping: %s", exc)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def main(argv=None):
    logging.basicConfig(level=os.environ.get("YUZU_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args = build_parser().parse_args(argv)
    return run(args.server, args.token, args.state_dir, args.config, args.dex_disable)


if __name__ == "__main__":
    sys.exit(main())
