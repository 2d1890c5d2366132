"""The agent's plugins. Each is written ``plugin.action``, declares a risk (read / write / destructive)
and a JSON Schema for its parameters (all parameter values are strings on the wire), and returns a
``Result``. ``execute`` is the one entry point: unknown actions and invalid parameters become a
REJECTED result, and an exception inside a plugin becomes a FAILURE, never a crash.

Plugins run in a worker thread; a long one may call ``ctx.progress(partial_output)``."""

import hashlib
import json
import os
import platform
import selectors
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psutil
from jsonschema import Draft202012Validator

from . import upload

READ, WRITE, DESTRUCTIVE = "read", "write", "destructive"
DIGITS = {"type": "string", "pattern": r"^[0-9]{1,7}$"}
SCRIPT_OUTPUT_CAP = 64 * 1024
SCRIPT_TIMEOUT_MAX = 3600
HASH_ALGORITHMS = ("sha256", "sha1", "sha512", "md5")
QUARANTINE_TABLE = "yuzu_quarantine"


@dataclass(frozen=True)
class Result:
    status: str  # SUCCESS | FAILURE | TIMEOUT | REJECTED
    output: str = ""
    exit_code: int | None = None
    error: str | None = None


@dataclass
class Context:
    """What a plugin may use besides its parameters: the agent's config, the server URL, progress."""

    config: dict = field(default_factory=dict)
    server: str = ""
    progress: Callable[[str], None] = lambda output: None
    stop: object = None  # a threading.Event set when the plugin is switched off (fleet.agent.control)


@dataclass(frozen=True)
class Plugin:
    name: str
    risk: str
    params: dict
    run: Callable[[dict, Context], Result]
    description: str = ""  # what it does, in one sentence — shown to the approver of a gated execution


def ok(data):
    return Result("SUCCESS", json.dumps(data, sort_keys=True), 0)


def failed(error, data=None):
    return Result("FAILURE", json.dumps(data, sort_keys=True) if data is not None else "", None, error)


def schema(properties=None, required=()):
    return {"type": "object", "properties": properties or {}, "required": list(required),
            "additionalProperties": False}


# --- read-only plugins -------------------------------------------------------------------------

def os_facts():
    """Also the agent's "os" inventory report."""
    u = platform.uname()
    try:
        release = platform.freedesktop_os_release()
    except OSError:
        release = {}
    return {
        "hostname": socket.gethostname(), "system": u.system, "kernel": u.release, "kernel_version": u.version,
        "machine": u.machine, "distribution": release.get("PRETTY_NAME", ""), "distribution_id": release.get("ID", ""),
        "distribution_version": release.get("VERSION_ID", ""), "cpu_count": psutil.cpu_count(),
        "memory_total": psutil.virtual_memory().total, "boot_time": int(psutil.boot_time()),
        "python": platform.python_version(),
    }


def os_info(params, ctx):
    return ok(os_facts())


def system_uptime(params, ctx):
    boot = psutil.boot_time()
    return ok({"boot_time": int(boot), "uptime_seconds": int(time.time() - boot),
               "load_average": [round(x, 2) for x in os.getloadavg()], "users": len(psutil.users())})


def process_list(params, ctx):
    name = params.get("name", "").lower()
    limit = int(params.get("limit") or plugin_config(ctx, "process").get("default_limit", "200"))
    procs = []
    for p in psutil.process_iter(["pid", "ppid", "name", "username", "status", "memory_info", "create_time"]):
        info = p.info
        if name and name not in (info["name"] or "").lower():
            continue
        mem = info["memory_info"]
        procs.append({"pid": info["pid"], "ppid": info["ppid"], "name": info["name"], "username": info["username"],
                      "status": info["status"], "rss": mem.rss if mem else None,
                      "create_time": int(info["create_time"] or 0)})
    procs.sort(key=lambda p: p["pid"])
    return ok({"count": len(procs), "processes": procs[:limit]})


def _usage(mountpoint, device="", fstype=""):
    u = psutil.disk_usage(mountpoint)
    return {"mountpoint": mountpoint, "device": device, "fstype": fstype, "total": u.total, "used": u.used,
            "free": u.free, "percent": u.percent}


def disk_usage(params, ctx):
    if params.get("path"):
        try:
            return ok({"disks": [_usage(params["path"])]})
        except OSError as exc:
            return failed(f"cannot read disk usage of {params['path']}: {exc.strerror or exc}")
    disks = []
    for part in psutil.disk_partitions(all=False):
        try:
            disks.append(_usage(part.mountpoint, part.device, part.fstype))
        except OSError:  # a mount we may not stat (permissions, stale network share)
            continue
    if not disks:
        disks.append(_usage("/"))
    return ok({"disks": disks})


FAMILIES = {socket.AF_INET: "ipv4", socket.AF_INET6: "ipv6", psutil.AF_LINK: "mac"}


def network_interfaces(params, ctx):
    stats = psutil.net_if_stats()
    out = []
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        st = stats.get(name)
        out.append({
            "name": name, "is_up": st.isup if st else None, "speed_mbps": st.speed if st else None,
            "mtu": st.mtu if st else None,
            "addresses": [{"family": FAMILIES.get(a.family, str(a.family)), "address": a.address,
                           "netmask": a.netmask} for a in addrs],
        })
    return ok({"interfaces": out})


def reboot_pending(params, ctx):
    reasons = []
    flag = "/var/run/reboot-required"
    if os.path.exists(flag):
        pkgs = ""
        try:
            with open(flag + ".pkgs") as f:
                pkgs = ", ".join(line.strip() for line in f if line.strip())
        except OSError:
            pass
        reasons.append(f"{flag} is present" + (f" (packages: {pkgs})" if pkgs else ""))
    modules = "/lib/modules"
    running = platform.release()
    if os.path.isdir(modules) and os.listdir(modules) and running not in os.listdir(modules):
        reasons.append(f"the running kernel {running} is no longer installed")
    if shutil.which("needs-restarting"):
        try:
            if subprocess.run(["needs-restarting", "-r"], capture_output=True, timeout=60).returncode == 1:
                reasons.append("needs-restarting -r reports a reboot is required")
        except (OSError, subprocess.TimeoutExpired):
            pass
    return ok({"reboot_pending": bool(reasons), "reasons": reasons})


def file_hash(params, ctx):
    path, algorithm = params["path"], params.get("algorithm", "sha256")
    h = hashlib.new(algorithm)
    size = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1024 * 1024):
                h.update(chunk)
                size += len(chunk)
    except OSError as exc:
        return failed(f"cannot read {path}: {exc.strerror or exc}", {"path": path, "algorithm": algorithm})
    return ok({"path": path, "algorithm": algorithm, "hash": h.hexdigest(), "size": size})


def file_stat(params, ctx):
    """Whether a path exists, and its type, mode and owner: what a compliance check asks of a file (a
    world-writable file, a missing config). A symlink is followed (its own mode means nothing on Linux);
    ``symlink`` says it was one. Reads metadata only."""
    path = params["path"]
    try:
        link = stat.S_ISLNK(os.lstat(path).st_mode)
        st = os.stat(path)
    except FileNotFoundError:
        return ok({"path": path, "exists": False})
    except OSError as exc:
        return failed(f"cannot stat {path}: {exc.strerror or exc}", {"path": path})
    kind = "file" if stat.S_ISREG(st.st_mode) else "directory" if stat.S_ISDIR(st.st_mode) else "other"
    return ok({"path": path, "exists": True, "type": kind, "symlink": link, "mode": f"{stat.S_IMODE(st.st_mode):04o}",
               "world_writable": bool(st.st_mode & stat.S_IWOTH), "uid": st.st_uid, "gid": st.st_gid,
               "size": st.st_size, "mtime": int(st.st_mtime)})


GREP_MAX_LINES = 20
GREP_TIMEOUT_S = 30


def file_grep(params, ctx):
    """Lines of a text file matching an extended regular expression (GNU grep -E: no catastrophic
    backtracking, and a timeout): a count and the first line numbers — not the lines, since a config check
    needs to know whether, not to copy the file off the device."""
    path, pattern = params["path"], params["pattern"]
    if not os.path.lexists(path):
        return ok({"path": path, "exists": False, "matches": 0, "lines": []})
    if not shutil.which("grep"):
        return failed("grep is not installed", {"path": path})
    try:
        proc = subprocess.run(["grep", "-a", "-n", "-E", "-e", pattern, "--", path], capture_output=True,
                              timeout=GREP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Result("TIMEOUT", error=f"grep did not finish within {GREP_TIMEOUT_S} s")
    if proc.returncode not in (0, 1):
        return failed(f"grep failed: {proc.stderr.decode(errors='replace').strip()[:500]}", {"path": path})
    numbers = [int(line.split(b":", 1)[0]) for line in proc.stdout.splitlines() if line.split(b":", 1)[0].isdigit()]
    return ok({"path": path, "exists": True, "matches": len(numbers), "lines": numbers[:GREP_MAX_LINES]})


SERVICE_PROPERTIES = "Id,Description,LoadState,ActiveState,SubState,UnitFileState,MainPID,ActiveEnterTimestamp"


def service_status(params, ctx):
    name = params["name"]
    # sd_booted(): systemd is the running init only if this directory exists.
    if not (shutil.which("systemctl") and os.path.isdir("/run/systemd/system")):
        return failed("unsupported: systemd is not the running init system on this host",
                      {"service": name, "result": "unsupported"})
    proc = subprocess.run(["systemctl", "show", "--no-pager", f"--property={SERVICE_PROPERTIES}", "--", name],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        return Result("FAILURE", proc.stdout, proc.returncode, proc.stderr.strip() or "systemctl show failed")
    props = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return ok({"service": name, "result": "ok", "properties": props})


# --- script.run --------------------------------------------------------------------------------

def allowed(argv, allow_list):
    """An allow-list entry is an argv; "*" matches any one argument, a final "**" any remaining ones."""
    for entry in allow_list:
        head, rest = (entry[:-1], True) if entry and entry[-1] == "**" else (entry, False)
        if (len(argv) >= len(head) if rest else len(argv) == len(head)) and \
                all(p == "*" or p == a for p, a in zip(head, argv, strict=False)):
            return True
    return False


def parse_argv(text):
    if text.lstrip().startswith("["):
        argv = json.loads(text)
        if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
            raise ValueError("argv must be a JSON array of strings")
        return argv
    return shlex.split(text)


def run_argv(argv, timeout, cap, progress=lambda output: None, stop=None):
    """Run without a shell; returns (exit code or None on timeout, output bytes capped at ``cap``, truncated)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    buf, truncated, reported = bytearray(), False, 0
    deadline, last_progress = time.monotonic() + timeout, time.monotonic()
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0:
            if stop is not None and stop.is_set():  # the plugin was switched off: end the process now
                deadline = time.monotonic()
                break
            if sel.select(min(remaining, 1.0)):
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                room = cap - len(buf)
                buf += chunk[:max(room, 0)]
                truncated |= len(chunk) > room  # keep draining so the child never blocks on a full pipe
            if time.monotonic() - last_progress >= 1.0 and len(buf) != reported:
                progress(buf.decode(errors="replace"))
                last_progress, reported = time.monotonic(), len(buf)
    proc.stdout.close()
    try:
        code = proc.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        code = None
    if code is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return code, bytes(buf), truncated


def script_run(params, ctx):
    try:
        argv = parse_argv(params["argv"])
    except ValueError as exc:
        return Result("REJECTED", error=f"invalid argv: {exc}")
    if not argv or not allowed(argv, ctx.config.get("script_allow", [])):
        return Result("REJECTED", error="argv is not on this agent's script allow-list")
    timeout = min(int(params.get("timeout", "30")), int(ctx.config.get("script_timeout_max", SCRIPT_TIMEOUT_MAX)))
    cap = int(ctx.config.get("script_output_cap", SCRIPT_OUTPUT_CAP))
    try:
        code, out, truncated = run_argv(argv, max(timeout, 1), cap, ctx.progress, ctx.stop)
    except OSError as exc:
        return failed(f"cannot execute {argv[0]}: {exc.strerror or exc}")
    text = out.decode(errors="replace") + (f"\n[output truncated at {cap} bytes]" if truncated else "")
    if code is None and ctx.stop is not None and ctx.stop.is_set():
        return Result("FAILURE", text, None, "kill_switched: stopped, the plugin was switched off; process killed")
    if code is None:
        return Result("TIMEOUT", text, None, f"timed out after {timeout} s; process killed")
    return Result("SUCCESS" if code == 0 else "FAILURE", text, code, None if code == 0 else f"exit code {code}")


# --- quarantine --------------------------------------------------------------------------------

def _server_addresses(server):
    parts = urlsplit(server)
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    try:
        addrs = sorted({ai[4][0] for ai in socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)})
    except (OSError, TypeError):
        addrs = []
    return addrs, port


def _resolvers():
    try:
        with open("/etc/resolv.conf") as f:
            return [line.split()[1] for line in f if line.startswith("nameserver") and len(line.split()) > 1]
    except OSError:
        return []


def quarantine_ruleset(server, extra):
    addrs, port = _server_addresses(server)
    keep = [(a, f"tcp dport {port}") for a in addrs] + [(a, "") for a in extra] + \
           [(r, "meta l4proto { tcp, udp } th dport 53") for r in _resolvers()]
    out_rules = [" ".join(filter(None, [f"{'ip6' if ':' in a else 'ip'} daddr {a}", match, "accept"]))
                 for a, match in keep]
    in_rules = [f"{'ip6' if ':' in a else 'ip'} saddr {a} accept" for a in extra]
    ruleset = "\n".join([
        f"table inet {QUARANTINE_TABLE} {{",
        "  chain input { type filter hook input priority -10; policy drop;",
        "    iif lo accept; ct state established,related accept;",
        *[f"    {r};" for r in in_rules], "  }",
        "  chain output { type filter hook output priority -10; policy drop;",
        "    oif lo accept; ct state established,related accept;",
        *[f"    {r};" for r in out_rules], "  }",
        "}",
    ])
    changes = ["drop every inbound connection except loopback and replies",
               "drop every outbound connection except loopback, replies, and: "
               + (", ".join(f"{a} {m}".strip() for a, m in keep) or "nothing (server address unresolved)")]
    return ruleset, changes, [a for a, _ in keep]


def _nft(args, stdin=None):
    if not shutil.which("nft"):
        return failed("nft (nftables) is not installed; cannot enforce")
    proc = subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True, timeout=30)
    if proc.returncode:
        return Result("FAILURE", proc.stdout, proc.returncode, proc.stderr.strip() or "nft failed")
    return None


def quarantine(params, ctx):
    extra = [a.strip() for a in params.get("allow", "").split(",") if a.strip()]
    ruleset, changes, keep = quarantine_ruleset(ctx.server, extra)
    enforce = bool(ctx.config.get("quarantine_enforce"))
    report = {"action": "quarantine", "enforced": enforce, "mode": "enforce" if enforce else "dry_run",
              "backend": "nftables", "nft_available": bool(shutil.which("nft")), "keeps_reachable": keep,
              "changes": changes, "ruleset": ruleset}
    if enforce:
        # "add table" + "delete table" first makes re-applying idempotent.
        err = _nft(["-f", "-"], f"add table inet {QUARANTINE_TABLE}\ndelete table inet {QUARANTINE_TABLE}\n{ruleset}\n")
        if err:
            return err
    return ok(report)


def quarantine_release(params, ctx):
    enforce = bool(ctx.config.get("quarantine_enforce"))
    report = {"action": "release", "enforced": enforce, "mode": "enforce" if enforce else "dry_run",
              "changes": [f"delete nftables table inet {QUARANTINE_TABLE}"]}
    if enforce:
        err = _nft(["-f", "-"], f"add table inet {QUARANTINE_TABLE}\ndelete table inet {QUARANTINE_TABLE}\n")
        if err:
            return err
    return ok(report)


# --- content distribution: upload one file under a grant -----------------------------------------

def plugin_config(ctx, plugin):
    """The configuration the server pushed for ``plugin`` (fleet.agent.control), {} when none."""
    return (ctx.config.get("plugin_config") or {}).get(plugin) or {}


def upload_file(params, ctx):
    path = params["path"]
    if not os.path.isfile(path):
        return failed(f"not a regular file: {path}")
    try:
        done = upload.upload_file(path, params["grant_id"], params["grant_secret"], ctx.server,
                                  cafile=ctx.config.get("trust_bundle"))
    except upload.UploadRefused as exc:
        return failed(f"upload refused: {exc}", {"status": exc.status, "reason": exc.reason})
    except OSError as exc:
        return failed(f"upload failed: {exc}")
    return ok(done)


#: Each plugin's configuration keys and their schemas (values are strings); the server validates
#: set_plugin_config against them (the ``config`` of the register catalogue).
CONFIG_SCHEMAS = {
    "process": {"default_limit": {"type": "string", "pattern": "^[0-9]{1,5}$",
                                  "description": "process.list's row limit when the call gives none"}},
    "content_dist": {"note": {"type": "string", "maxLength": 256}},
}


# --- the registry ------------------------------------------------------------------------------

PLUGINS = {p.name: p for p in [
    Plugin("os.info", READ, schema(), os_info, "Reports the operating system, version, kernel and hostname."),
    Plugin("system.uptime", READ, schema(), system_uptime, "Reports the boot time and uptime."),
    Plugin("process.list", READ, schema({"name": {"type": "string", "maxLength": 256}, "limit": DIGITS}), process_list,
           "Lists running processes (optionally those whose name contains `name`), with CPU and memory use."),
    Plugin("disk.usage", READ, schema({"path": {"type": "string", "minLength": 1, "maxLength": 4096}}), disk_usage,
           "Reports used and free space of every mounted filesystem, or of the one holding `path`."),
    Plugin("network.interfaces", READ, schema(), network_interfaces,
           "Lists network interfaces with their addresses and link state."),
    Plugin("reboot.pending", READ, schema(), reboot_pending, "Reports whether the system is waiting for a reboot."),
    Plugin("file.hash", READ, schema({"path": {"type": "string", "minLength": 1, "maxLength": 4096},
                                      "algorithm": {"type": "string", "enum": list(HASH_ALGORITHMS)}}, ["path"]),
           file_hash, "Hashes one file (sha256 by default); reads the file, changes nothing."),
    Plugin("file.stat", READ, schema({"path": {"type": "string", "minLength": 1, "maxLength": 4096}}, ["path"]),
           file_stat, "Reports whether a path exists, its type, mode, owner and size; changes nothing."),
    Plugin("file.grep", READ, schema({"path": {"type": "string", "minLength": 1, "maxLength": 4096},
                                      "pattern": {"type": "string", "minLength": 1, "maxLength": 1024}},
                                     ["path", "pattern"]), file_grep,
           "Counts the lines of a text file matching an extended regular expression (grep -E; returns line "
           "numbers, not the lines)."),
    Plugin("service.status", READ, schema({"name": {"type": "string", "pattern": r"^[A-Za-z0-9@._:\\-]{1,256}$"}},
                                          ["name"]), service_status, "Reports whether one system service is running."),
    Plugin("script.run", WRITE, schema({"argv": {"type": "string", "minLength": 1, "maxLength": 65536},
                                        "timeout": DIGITS,
                                        "signature": {"type": "string", "maxLength": 512,
                                                      "pattern": "^[A-Za-z0-9+/=]*$"},
                                        "signer_cert": {"type": "string", "maxLength": 8192}}, ["argv"]), script_run,
           "Runs one command line from the agent's allow-list (no shell) and returns its output; the command may "
           "change the system."),
    Plugin("quarantine.quarantine", DESTRUCTIVE,
           schema({"allow": {"type": "string", "maxLength": 4096, "pattern": r"^[0-9A-Fa-f.:/, ]*$"}}), quarantine,
           "Cuts the device off the network except the yuzu server, DNS and the `allow` list (nftables; a dry run "
           "unless the agent's operator enabled enforcement)."),
    Plugin("quarantine.release", DESTRUCTIVE, schema(), quarantine_release,
           "Removes the network quarantine from the device."),
    Plugin("content_dist.upload_file", WRITE,
           schema({"path": {"type": "string", "minLength": 1, "maxLength": 4096},
                   "grant_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                   "grant_secret": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
                  ["path", "grant_id", "grant_secret"]), upload_file,
           "Uploads one file from the device to the server under a one-time upload grant (mint_upload_grant)."),
]}


def catalogue(registry=PLUGINS):
    """The ``plugins`` field of the register message."""
    out = {name: {"risk": p.risk, "params": p.params, "description": p.description} for name, p in registry.items()}
    for name, entry in out.items():
        if name.split(".", 1)[0] in CONFIG_SCHEMAS:
            entry["config"] = CONFIG_SCHEMAS[name.split(".", 1)[0]]
    return out


def execute(registry, plugin, action, params, ctx):
    p = registry.get(f"{plugin}.{action}")
    if p is None:
        return Result("REJECTED", error=f"unknown plugin/action: {plugin}.{action}")
    error = next(iter(Draft202012Validator(p.params).iter_errors(params)), None)
    if error is not None:
        where = "/".join(str(x) for x in error.absolute_path) or "parameters"
        return Result("REJECTED", error=f"invalid parameters at '{where}': {error.message}")
    try:
        return p.run(params, ctx)
    except Exception as exc:  # a plugin bug is a FAILURE of this command, never a crash of the agent
        return failed(f"{type(exc).__name__}: {exc}")


def simulated(registry=PLUGINS):
    """The same catalogue with instant synthetic results, for agent_swarm's simulated agents."""
    def fake(name):
        return lambda params, ctx: ok({"simulated": True, "plugin": name, "params": params,
                                       "hostname": ctx.config.get("hostname", "")})
    return {name: Plugin(name, p.risk, p.params, fake(name), p.description) for name, p in registry.items()}
