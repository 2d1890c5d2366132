"""TOTP codes for tests, computed the way django-otp verifies them."""

import time

from django_otp.oath import TOTP


def code(device):
    """The current code."""
    t = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    t.time = time.time()
    return f"{t.token():0{device.digits}d}"


def next_code(device):
    """A code the device accepts after the one it last accepted: one step past now, corrected by the
    drift the server recorded (a login code verified just after a 30 s boundary leaves drift -1)."""
    device.refresh_from_db()
    t = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift + 1)
    t.time = time.time()
    return f"{t.token():0{device.digits}d}"
