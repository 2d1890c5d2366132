"""Real daphne processes on the test database."""

from yuzu.testing import Proc, free_port, server_env
from yuzu.testing import start_daphne as spawn_daphne


class Daphne:
    """A daphne serving the test database on a free port; ``base`` and ``mcp`` are its URLs."""

    def __init__(self, port: int, process: Proc):
        self.port, self.process = port, process
        self.proc, self.log = process.proc, process.log_path
        self.base = f"http://127.0.0.1:{port}"
        self.mcp = self.base + "/mcp/v1/"

    def stop(self):
        self.process.stop()


def start_daphne(tmp_path, **env):
    port = free_port()
    return Daphne(port, spawn_daphne(port, server_env(**env), tmp_path))
