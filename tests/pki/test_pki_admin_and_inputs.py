"""The admin's certificate list and its step-up Revoke action; hostile input to the CA's parsers (property
tests: whatever arrives, the answer is a CertError or a result, never another exception)."""

import time

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pki import ca
from pki.models import IssuedCert
from tests.pki.test_ca import agent_leaf, unknown_algorithm_csrs
from tests.support.otp import code
from yuzu.auth import MFA_SESSION_KEY
from yuzu.models import TOTPDevice

pytestmark = pytest.mark.django_db
LIST = "/admin/pki/issuedcert/"


@pytest.fixture
def admin_client(make_user):
    user = make_user("boss", "Administrator", superuser=True, password="s3cret-password")
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    c = Client()
    r = c.post("/admin/login/?next=/admin/", {"username": "boss", "password": "s3cret-password",
                                               "otp_token": code(device)})
    assert r.status_code == 302
    return c


def test_admin_lists_and_revokes_with_a_fresh_code_only(admin_client):
    _, row = agent_leaf()
    page = admin_client.get(LIST)
    assert page.status_code == 200 and row.serial_hex in page.content.decode()
    s = admin_client.session
    s[MFA_SESSION_KEY] = time.time() - 3600  # the login's proof has gone stale
    s.save()
    r = admin_client.post(LIST, {"action": "revoke_selected", "_selected_action": [row.serial_hex]}, follow=True)
    assert "fresh authenticator code" in r.content.decode()
    assert IssuedCert.objects.get(pk=row.pk).status == "active"
    s = admin_client.session
    s[MFA_SESSION_KEY] = time.time()
    s.save()
    r = admin_client.post(LIST, {"action": "revoke_selected", "_selected_action": [row.serial_hex]}, follow=True)
    assert "revoked" in r.content.decode()
    assert IssuedCert.objects.get(pk=row.pk).status == "revoked"


def test_a_viewer_sees_the_certificates_but_cannot_revoke(make_user):
    user = make_user("viewer", "Viewer", password="s3cret-password")
    user.is_staff = True
    user.save()
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    c = Client()
    c.post("/admin/login/?next=/admin/", {"username": "viewer", "password": "s3cret-password",
                                           "otp_token": code(device)})
    _, row = agent_leaf()
    page = c.get(LIST)
    assert page.status_code == 200 and "revoke_selected" not in page.content.decode()  # Security:Read only
    c.post(LIST, {"action": "revoke_selected", "_selected_action": [row.serial_hex]})
    assert IssuedCert.objects.get(pk=row.pk).status == "active"


HOSTILE = st.one_of(st.text(max_size=300), st.sampled_from([
    "-----BEGIN CERTIFICATE REQUEST-----\n\n-----END CERTIFICATE REQUEST-----",
    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----", "\x00", "A" * 20000]))


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(csr=HOSTILE, cert=HOSTILE, proof=st.text(max_size=100), serial=st.text(max_size=80))
def test_hostile_input_is_refused_cleanly(csr, cert, proof, serial):
    for call in (lambda: ca.load_csr(csr), lambda: ca.normalise_serial(serial),
                 lambda: ca.verify_agent_proof("a" * 32, cert, proof, "00" * 32)):
        try:
            call()
        except ca.CertError:
            pass


def test_a_csr_whose_key_algorithm_is_unknown_is_a_400_not_a_500(mint):
    """cryptography parses such a CSR, then raises UnsupportedAlgorithm (no ValueError) reading its key: load_csr let
    it through — a 500 on the code-signing issue (and a dropped agent connection on cert.enroll)."""
    c = Client(HTTP_AUTHORIZATION=f"Bearer {mint('ca-admin', role='Administrator')}", raise_request_exception=False)
    for csr in unknown_algorithm_csrs():
        with pytest.raises(ca.CertError, match="not a PEM certificate signing request|must be EC"):
            ca.load_csr(csr)
        r = c.post("/api/v1/ca/issue", {"csr_pem": csr, "signer_name": "release", "justification": "test"},
                   content_type="application/json")
        assert r.status_code == 400, r.content
    assert not IssuedCert.objects.filter(purpose="code-signing").exists()
