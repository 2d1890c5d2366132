"""Typed installed-software inventory and detected licences on a Linux agent (spec/operator.md §4–5).

Machine-wide packages from the dpkg or rpm database (or pacman), plus Python and npm packages installed
globally where present: rows of name, version, publisher, install date, source. The licence scan reads
dpkg DEP-5 copyright headers, rpm's License tag, and entitlement certificates' notAfter. Imports nothing
of the server; fleet.agent.client sends the results as ``report`` frames (``software``, ``licenses``)."""

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime

from cryptography import x509

MAX_ROWS = 20000
MAX_FIELD = 256
MAX_LICENSES = 2000


def _clip(text, limit=MAX_FIELD):
    return (text or "").replace("\x00", "").strip()[:limit]


def _date(ts):
    try:
        return datetime.fromtimestamp(float(ts), UTC).date().isoformat() if ts else ""
    except (ValueError, OverflowError, OSError):
        return ""


def _run(argv, timeout=60):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              errors="replace").stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def dpkg_packages(admindir="/var/lib/dpkg"):
    if not shutil.which("dpkg-query") or not os.path.isdir(admindir):
        return []
    out = _run(["dpkg-query", f"--admindir={admindir}", "-W", "-f",
                "${Package}\t${Version}\t${Maintainer}\t${db:Status-Abbrev}\t${Architecture}\n"])
    rows = []
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) < 4 or not parts[3].startswith("ii"):
            continue
        name, version, maintainer, arch = parts[0], parts[1], parts[2], parts[4] if len(parts) > 4 else ""
        info = os.path.join(admindir, "info", f"{name}.list")
        if not os.path.exists(info) and arch:
            info = os.path.join(admindir, "info", f"{name}:{arch}.list")
        try:
            installed = _date(os.path.getmtime(info))
        except OSError:
            installed = ""
        rows.append({"name": name, "version": version, "publisher": maintainer, "install_date": installed,
                     "source": "dpkg"})
    return rows


def rpm_packages():
    if not shutil.which("rpm"):
        return []
    out = _run(["rpm", "-qa", "--qf", "%{NAME}\t%{VERSION}-%{RELEASE}\t%{VENDOR}\t%{INSTALLTIME}\n"])
    rows = []
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 4:
            rows.append({"name": parts[0], "version": parts[1], "publisher": "" if parts[2] == "(none)" else parts[2],
                         "install_date": _date(parts[3]), "source": "rpm"})
    return rows


def pacman_packages():
    if not shutil.which("pacman"):
        return []
    return [{"name": n, "version": v, "publisher": "", "install_date": "", "source": "pacman"}
            for n, _, v in (line.partition(" ") for line in _run(["pacman", "-Q"]).splitlines()) if v]


DIST_INFO_RE = re.compile(r"^(?P<name>.+?)-(?P<version>[^-]+?)\.(dist-info|egg-info)$")


def pip_globals(roots=("/usr/lib/python3/dist-packages", "/usr/local/lib/python3*/dist-packages",
                       "/usr/local/lib/python3*/site-packages")):
    rows = []
    for pattern in roots:
        for root in glob.glob(pattern):
            for entry in sorted(os.listdir(root)) if os.path.isdir(root) else []:
                m = DIST_INFO_RE.match(entry)
                if m:
                    path = os.path.join(root, entry)
                    rows.append({"name": m["name"].replace("_", "-").lower(), "version": m["version"], "publisher": "",
                                 "install_date": _date(os.path.getmtime(path)), "source": "pip"})
    return rows


def npm_globals(roots=("/usr/lib/node_modules", "/usr/local/lib/node_modules")):
    rows = []
    for root in roots:
        for manifest in sorted(glob.glob(os.path.join(root, "*", "package.json"))
                               + glob.glob(os.path.join(root, "@*", "*", "package.json"))):
            try:
                with open(manifest) as f:
                    data = json.load(f)
            except (OSError, ValueError):
                continue
            author = data.get("author")
            rows.append({"name": str(data.get("name") or ""), "version": str(data.get("version") or ""),
                         "publisher": author.get("name", "") if isinstance(author, dict) else str(author or ""),
                         "install_date": _date(os.path.getmtime(manifest)), "source": "npm"})
    return rows


def installed_software():
    """Every package row, typed and clipped, sorted (so the content hash is stable)."""
    rows = dpkg_packages() or rpm_packages() or pacman_packages()
    rows += pip_globals() + npm_globals()
    clean = [{"name": _clip(r["name"]), "version": _clip(r["version"], 128), "publisher": _clip(r["publisher"]),
              "install_date": _clip(r["install_date"], 32), "source": r["source"]} for r in rows if r.get("name")]
    clean.sort(key=lambda r: (r["source"], r["name"], r["version"]))
    return clean[:MAX_ROWS]


def content_hash(rows):
    return hashlib.sha256(json.dumps(rows, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# --- licences ------------------------------------------------------------------------------------

LICENSE_LINE_RE = re.compile(r"^License:\s*(\S.*)$", re.MULTILINE)
OPEN_SOURCE_HINTS = ("GPL", "LGPL", "BSD", "MIT", "Apache", "MPL", "Artistic", "ISC", "Expat", "Zlib", "PSF",
                     "public-domain", "CC0", "EPL", "OFL")


def _kind(text):
    return "open_source" if any(h.lower() in text.lower() for h in OPEN_SOURCE_HINTS) else "unknown"


def dpkg_licenses(packages, docdir="/usr/share/doc"):
    out = []
    for pkg in packages:
        if pkg["source"] != "dpkg" or len(out) >= MAX_LICENSES:
            continue
        try:
            with open(os.path.join(docdir, pkg["name"], "copyright"), errors="replace") as f:
                head = f.read(16384)
        except OSError:
            continue
        if not head.startswith("Format:"):
            continue  # not machine-readable (DEP-5)
        m = LICENSE_LINE_RE.search(head)
        if not m:
            continue
        licence = _clip(m[1], 64)
        kind = _kind(licence)
        out.append({"product": pkg["name"], "vendor": pkg["publisher"], "version": pkg["version"],
                    "license_type": kind, "state": "licensed" if kind == "open_source" else "unknown",
                    "channel": licence, "expiry_at": 0, "detector": "package_metadata", "confidence": "probable",
                    "key_hint": "", "exe_hints": []})
    return out


def rpm_licenses():
    if not shutil.which("rpm"):
        return []
    out = []
    for line in _run(["rpm", "-qa", "--qf", "%{NAME}\t%{VERSION}\t%{VENDOR}\t%{LICENSE}\n"]).splitlines()[:MAX_LICENSES]:
        parts = line.split("\t")
        if len(parts) == 4:
            kind = _kind(parts[3])
            out.append({"product": _clip(parts[0]), "vendor": _clip(parts[2]), "version": _clip(parts[1], 128),
                        "license_type": kind, "state": "licensed" if kind == "open_source" else "unknown",
                        "channel": _clip(parts[3], 64), "expiry_at": 0, "detector": "package_metadata",
                        "confidence": "probable", "key_hint": "", "exe_hints": []})
    return out


def entitlement_licenses(pattern="/etc/pki/entitlement/*.pem"):
    out = []
    for path in sorted(glob.glob(pattern)):
        if path.endswith("-key.pem"):
            continue
        try:
            with open(path, "rb") as f:
                cert = x509.load_pem_x509_certificate(f.read())
        except (OSError, ValueError):
            continue
        end = cert.not_valid_after_utc
        expiry = int(datetime(end.year, end.month, end.day, tzinfo=UTC).timestamp())
        expired = end < datetime.now(UTC)
        out.append({"product": os.path.basename(path)[:-4], "vendor": "Red Hat", "version": "",
                    "license_type": "subscription", "state": "expired" if expired else "subscription_active",
                    "channel": "entitlement", "expiry_at": expiry, "detector": "entitlement_cert",
                    "confidence": "authoritative", "key_hint": format(cert.serial_number, "x")[-4:], "exe_hints": []})
    return out


def detected_licenses(packages):
    rows = entitlement_licenses() + (rpm_licenses() if any(p["source"] == "rpm" for p in packages)
                                     else dpkg_licenses(packages))
    return rows[:MAX_LICENSES]
