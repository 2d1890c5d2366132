"""Embedded mode (SQLite) on a full disk and on a file system gone read-only (issue 22; docs/operations.md
"Embedded database: disk full or read-only").

The SQLite file lives on a small ext4 volume of its own (a loop device, mounted ``errors=remount-ro``; needs
root: skipped otherwise). One daphne in embedded mode, serving throughout:

1. the volume fills to the last block: writes are refused with a clear 503 (``fault: disk_full``), reads keep
   working on REST and MCP; once space is freed the same process writes again;
2. the volume hits an error and the kernel turns it read-only under the running server (ext4's
   ``errors=remount-ro``, triggered through /sys/fs/ext4/<dev>/trigger_fs_error): writes refused
   (``fault: read_only``), reads keep working; the operator stops the server, runs e2fsck, mounts again.

Afterwards ``PRAGMA integrity_check`` says ``ok`` and every row committed before the faults is there."""

import os
import shutil
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from .services import mcp_tool, until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="loop-mounts a small ext4 volume for the database: needs root")


class Volume:
    def __init__(self, tmp_path):
        self.image, self.mnt = tmp_path / "volume.img", tmp_path / "db"
        self.mnt.mkdir()
        subprocess.run(["truncate", "-s", "96M", str(self.image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(self.image)], check=True, capture_output=True)

    def mount(self):
        r = subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.mnt)], capture_output=True)
        if r.returncode:
            pytest.skip(f"cannot loop-mount an ext4 volume here ({r.stderr.decode().strip()})")

    def umount(self, lazy=False):
        subprocess.run(["umount", *(["-l"] if lazy else []), str(self.mnt)], capture_output=True)

    def fail(self):
        """What an I/O error does to a volume mounted errors=remount-ro: read-only, under open files."""
        dev = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(self.mnt)], capture_output=True, text=True).stdout
        Path(f"/sys/fs/ext4/{Path(dev.strip()).name}/trigger_fs_error").write_text("1")

    def fsck(self):
        return subprocess.run(["e2fsck", "-fy", str(self.image)], capture_output=True, text=True)


@pytest.fixture
def volume(tmp_path):
    if shutil.which("mkfs.ext4") is None or shutil.which("e2fsck") is None:
        pytest.skip("needs e2fsprogs (mkfs.ext4, e2fsck)")
    v = Volume(tmp_path)
    v.mount()
    yield v
    v.umount(lazy=True)  # the loop device is detached with it (autoclear)


def _write(http, base, admin):
    return http.post(base + "/api/v1/management-groups", headers={"Authorization": f"Bearer {admin}"},
                     json={"name": f"g-{uuid.uuid4().hex[:10]}"})


def _reads(http, base, admin, mcp):
    for path in ("/api/v1/agents", "/api/v1/management-groups", "/api/v1/audit", "/api/v1/executions"):
        r = http.get(base + path, headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    r = mcp_tool(http, base, mcp, "list_management_groups")
    assert r.status_code == 200 and "result" in r.json(), r.text[:300]
    return r.json()["result"]


MESSAGES = {"read_only": "read-only", "disk_full": "disk is full", "unavailable": "unavailable"}


def _refused(r, *kinds):
    """An honest refusal of one of ``kinds``: 503, the database named, a retry hint (a minute or more where an
    operator has to act first)."""
    assert r.status_code == 503, (r.status_code, r.text[:400])
    err = r.json()["error"]
    assert err["fault"] in kinds and err["store"] == "database" and err["retry_after_ms"] > 0, err
    assert err["fault"] == "unavailable" or err["retry_after_ms"] >= 60000, err
    assert MESSAGES[err["fault"]] in err["message"], err
    return err


@pytest.mark.timeout(400)
@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
def test_full_disk_and_read_only_volume_refuse_writes_keep_reads_and_corrupt_nothing(volume, cluster_on, synchronous):
    db = volume.mnt / "yuzu.sqlite3"
    c = cluster_on(sqlite_path=str(db), YUZU_SQLITE_SYNCHRONOUS=synchronous)
    c.prepare()
    admin = c.token("disk-admin", "Administrator")
    mcp = c.token("disk-mcp", "Administrator", tier="operator")
    base = c.daphne()
    http = httpx.Client(trust_env=False, timeout=60)
    for _ in range(3):
        assert _write(http, base, admin).status_code == 201
    written = 3

    # 1. the disk fills up
    filler = volume.mnt / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M"], capture_output=True)  # until ENOSPC
    refused = None
    for _ in range(200):  # SQLite may still fit a few rows in pages it has free
        t = time.monotonic()
        r = _write(http, base, admin)
        assert time.monotonic() - t < 30
        if r.status_code != 201:
            refused = r
            break
        written += 1
    assert refused is not None, "no write was refused on a full disk"
    full = _refused(refused, "disk_full")
    _reads(http, base, admin, mcp)
    filler.unlink()
    until(lambda: _write(http, base, admin).status_code == 201, 30, "writes after space returned")
    written += 1

    # 2. the volume fails and the kernel makes it read-only under the running server
    volume.fail()
    t = time.monotonic()
    # SQLite meets the remount either as a read-only file (SQLITE_READONLY) or, when its write hits the I/O
    # error itself first, as "disk I/O error" — which one is a race with the kernel; both are honest refusals.
    ro = _refused(_write(http, base, admin), "read_only", "unavailable")
    assert time.monotonic() - t < 30
    result = _reads(http, base, admin, mcp)  # reads keep working; the tool's audit row could not be written
    assert result["structuredContent"].get("audit_persisted") is False, result
    assert http.get(base + "/healthz").status_code == 200

    # the operator's way back: stop the server, check the file system, mount it again
    c.close()
    volume.umount()
    fsck = volume.fsck()
    assert fsck.returncode in (0, 1), fsck.stdout + fsck.stderr  # 1: errors corrected
    volume.mount()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        kept = conn.execute("SELECT count(*) FROM fleet_managementgroup").fetchone()[0]
    finally:
        conn.close()
    if synchronous == "FULL":
        assert kept == written, (kept, written)  # every committed write is there, no refused one is
    else:  # NORMAL (the default): the commits since the last WAL checkpoint may be lost with the volume
        assert kept <= written, (kept, written)
    base = c.daphne("daphne-after")
    assert _write(http, base, admin).status_code == 201
    print(f"\nembedded (synchronous={synchronous}): disk full → {full['message']!r}; read-only → {ro['message']!r}; "
          f"integrity ok, {kept} of {written} committed rows kept")
