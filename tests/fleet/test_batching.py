"""fleet.batching: what a server process's agent connections hand in while a batch runs goes together in the next
one, each caller gets its own item's result, and a failing batch fails only the items that fail on their own. And
the heartbeats batched that way (fleet.identity.heartbeats): one UPDATE and one certificate query for a batch, each
connection told whether its own certificate is still active."""

import asyncio
from datetime import timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import identity
from fleet.batching import Batcher
from fleet.models import Agent
from pki import ca
from yuzu.metrics import CA_REVOKED_CERT


def run(coro):
    return asyncio.run(coro)


def test_items_handed_in_while_a_batch_runs_go_together_in_the_next_one():
    batches, gate = [], None

    async def apply(items):
        batches.append(list(items))
        if len(batches) == 1:
            await gate.wait()  # the first (lone) item's batch is still running while the others arrive
        return [item * 10 for item in items]

    async def scenario():
        nonlocal gate
        gate = asyncio.Event()
        batcher = Batcher(apply, "numbers", max_batch=3)
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0)
        rest = [asyncio.ensure_future(batcher.submit(n)) for n in range(2, 7)]
        await asyncio.sleep(0)
        gate.set()
        return await first, await asyncio.gather(*rest)

    first, rest = run(scenario())
    assert first == 10 and rest == [20, 30, 40, 50, 60]  # each caller its own item's result
    assert batches == [[1], [2, 3, 4], [5, 6]]  # at once, then at most max_batch at a time


def test_a_failing_batch_is_run_again_item_by_item_and_fails_only_the_bad_item():
    calls = []

    async def apply(items):
        calls.append(list(items))
        if "bad" in items:
            raise ValueError("cannot store 'bad'")
        return [item.upper() for item in items]

    async def scenario():
        batcher = Batcher(apply, "words")
        results = await asyncio.gather(*(batcher.submit(w) for w in ("a", "bad", "c")), return_exceptions=True)
        return results, await batcher.submit("d")  # the batcher goes on working

    (a, bad, c), d = run(scenario())
    assert (a, c, d) == ("A", "C", "D")
    assert isinstance(bad, ValueError) and "bad" in str(bad)
    assert calls == [["a", "bad", "c"], ["a"], ["bad"], ["c"], ["d"]]


def _cert(agent_id):
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
    return ca.issue_agent_cert(agent_id, x509.load_pem_x509_csr(csr.public_bytes(serialization.Encoding.PEM)))


@pytest.mark.django_db
def test_heartbeats_of_many_connections_in_one_update_one_credential_query_and_one_certificate_query():
    long_ago = timezone.now() - timedelta(hours=1)
    for agent_id in ("a1", "a2", "a3", "a4"):
        Agent.objects.create(agent_id=agent_id, hostname=agent_id, connected=agent_id != "a3", last_seen=long_ago,
                             credential_hash="" if agent_id == "a4" else "0" * 64)
    kept, revoked = _cert("a1"), _cert("a2")
    revoked.revoke("compromised")
    before = CA_REVOKED_CERT.labels("heartbeat")._value.get()
    with CaptureQueriesContext(connection) as queries:
        results = identity.heartbeats([("a1", kept.serial_hex), ("a2", revoked.serial_hex), ("a3", None),
                                       ("a4", None), ("gone", None)])
    # a2's connection proved a certificate revoked since, a4's credential was revoked, "gone" was deleted: closed
    assert results == [True, False, True, False, False]
    assert len(queries) == 3
    assert CA_REVOKED_CERT.labels("heartbeat")._value.get() == before + 1
    # seen: every one of them (a3, marked disconnected by a sweep, is connected again)
    assert all(a.connected and a.last_seen > long_ago for a in Agent.objects.all())
    assert identity.heartbeats([("a3", None)]) == [True]
