"""System packages the suite drives for real: tmux (bridge panes) and chromium (the admin approval
browser test). Installed from Debian's packages when missing and we may (root with apt-get)."""

import os
import shutil
import subprocess
import sys

NEEDED = {"tmux": "tmux", "chromium": "chromium", "node": "nodejs"}


def main():
    missing = [pkg for cmd, pkg in NEEDED.items() if shutil.which(cmd) is None]
    if not missing:
        return 0
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"installing system packages: {' '.join(missing)}", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], check=False, env=env)
    still = [cmd for cmd in NEEDED if shutil.which(cmd) is None]
    if still:
        print(f"note: {', '.join(still)} not installed; the tests that drive them will say so", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
