"""Start a bridge worker with exactly the environment held in a private file, and remove the file first.

``python launch.py <env.json> argv...`` reads the JSON object of variables (a 0600 file the terminal backend
wrote with ``tempfile.mkstemp``), deletes it, and exec's ``argv`` with exactly that environment. The
worker's token therefore never appears on a command line: tmux keeps its first client's argv as the server's
own for as long as the server lives, and every user on the host can read it with ``ps``.

Standard library only: it runs as a script under any working directory, before Django exists."""

import json
import os
import sys


def main(args):
    if len(args) < 2:
        sys.exit("usage: launch.py <env.json> argv...")
    path, argv = args[0], args[1:]
    with open(path, encoding="utf-8") as f:
        env = json.load(f)
    os.unlink(path)
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    main(sys.argv[1:])
