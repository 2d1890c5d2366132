"""Start a bridge worker with exactly the environment held in a private file, and remove the file first.

``python launch.py [--user NAME] <env.json> argv...`` reads the JSON object of variables (a 0600 file the terminal
backend wrote with ``tempfile.mkstemp``), deletes it, and exec's ``argv`` with exactly that environment. The
worker's token therefore never appears on a command line: tmux keeps its first client's argv as the server's
own for as long as the server lives, and every user on the host can read it with ``ps``.

With ``--user`` (a profile's ``run_as``; the bridge's IsolationGuard checked it before the spawn) the launcher, which
runs as the server's user (root), drops to that OS user once the file is read and gone: its groups
(initgroups), its gid, its uid — real, effective and saved, so nothing can be taken back — and ``HOME``, ``USER``,
``LOGNAME`` of that user; then it enters the working directory again as that user, and exits with a message rather
than run the worker anywhere else.

Standard library only: it runs as a script under any working directory, before Django exists."""

import json
import os
import pwd
import sys


def drop_to(name, env):
    """Become OS user ``name`` for good (see the module docstring); returns ``env`` with that user's HOME."""
    pw = pwd.getpwnam(name)
    cwd = os.getcwd()
    os.initgroups(pw.pw_name, pw.pw_gid)
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    if os.getuid() != pw.pw_uid or os.geteuid() != pw.pw_uid:
        sys.exit(f"launch.py: could not become user {name}")
    os.chdir(cwd)  # as that user: refused if it may not enter it
    return {**env, "HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name}


def main(args):
    user = None
    if args[:1] == ["--user"]:
        user, args = (args[1] if len(args) > 1 else ""), args[2:]
    if len(args) < 2 or user == "":
        sys.exit("usage: launch.py [--user NAME] <env.json> argv...")
    path, argv = args[0], args[1:]
    with open(path, encoding="utf-8") as f:
        env = json.load(f)
    os.unlink(path)
    if user is None:
        os.execvpe(argv[0], argv, env)
    # Everything Python itself needs is found before the drop: this interpreter's own library may be one the
    # user cannot read (under root's home), and os.execvpe imports a module on its way.
    program = which(argv[0], env)
    try:
        env = drop_to(user, env)
        os.execve(program, argv, env)
    except (KeyError, OSError) as exc:
        sys.exit(f"launch.py: cannot run {argv[0]} as OS user {user}: {exc}")


def which(program, env):
    """``program`` as the exec would find it on the worker's PATH (as it is when it holds a '/')."""
    if "/" in program:
        return program
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return program


if __name__ == "__main__":
    main(sys.argv[1:])
