"""The CA's records (spec/pki.md §2): the CA itself (one row), every certificate it issued, every CRL it
published. The CA private key is a sealed blob (yuzu.secrets: envelope encryption under the KEK, which lives
outside the database), so a database dump alone never yields it."""

from datetime import timedelta

from django.db import models, transaction
from django.utils import timezone

from yuzu.secrets import sealed_column

EXPIRING_WINDOW = timedelta(days=14)


class CaRoot(models.Model):
    """The install's CA: one row (pk 1), created on first use (pki.ca.authority)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    cert_pem = models.TextField()
    key_sealed = models.BinaryField(help_text="the CA private key (PKCS#8 PEM), sealed with yuzu.secrets")
    algo = models.CharField(max_length=16, default="EcP384")
    fingerprint_sha256 = models.CharField(max_length=64)
    key_id = models.CharField(max_length=64, help_text="SHA-256 of the CA's SubjectPublicKeyInfo, hex")
    not_before = models.DateTimeField()
    not_after = models.DateTimeField()
    mode = models.CharField(max_length=16, default="builtin")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "certificate authority"

    def __str__(self):
        return f"CA {self.fingerprint_sha256[:16]}… (until {self.not_after:%Y-%m-%d})"


KEY = sealed_column("pki", CaRoot, "key_sealed")


class IssuedCertQuerySet(models.QuerySet):
    def active(self):
        return self.filter(status=IssuedCert.ACTIVE, not_after__gt=timezone.now())

    def expiring_count(self):
        now = timezone.now()
        return self.filter(status=IssuedCert.ACTIVE, not_after__gt=now, not_after__lte=now + EXPIRING_WINDOW).count()


class IssuedCert(models.Model):
    ACTIVE, REVOKED = "active", "revoked"
    PURPOSES = ("https", "server", "gateway", "agent", "code-signing")
    SERVER_PURPOSES = ("https", "server", "gateway")

    serial_hex = models.CharField(max_length=64, primary_key=True, help_text="uppercase hex, no colons")
    subject = models.CharField(max_length=512)
    san = models.CharField(max_length=1024, blank=True, default="")
    purpose = models.CharField(max_length=16, choices=[(p, p) for p in PURPOSES])
    agent_id = models.CharField(max_length=64, blank=True, default="", db_index=True,
                                help_text="the agent a purpose=agent leaf identifies")
    signer_name = models.CharField(max_length=63, blank=True, default="", db_index=True)
    not_after = models.DateTimeField()
    status = models.CharField(max_length=8, default=ACTIVE, choices=[(ACTIVE, ACTIVE), (REVOKED, REVOKED)])
    revocation_reason = models.CharField(max_length=256, blank=True, default="")
    revoked_at = models.DateTimeField(null=True, blank=True)
    issued_at = models.DateTimeField(default=timezone.now)
    issued_by = models.CharField(max_length=200)
    cert_pem = models.TextField()
    issuer_fingerprint = models.CharField(max_length=64)
    issuer_key_id = models.CharField(max_length=64)

    objects = IssuedCertQuerySet.as_manager()

    class Meta:
        ordering = ["-issued_at", "-serial_hex"]
        indexes = [models.Index(fields=["purpose", "status"])]
        verbose_name = "issued certificate"

    def __str__(self):
        return f"{self.serial_hex} {self.subject} ({self.purpose}, {self.status})"

    def revoke(self, reason):
        """Revoke if still active (one conditional UPDATE). Returns whether this call revoked it."""
        now = timezone.now()
        done = IssuedCert.objects.filter(pk=self.pk, status=self.ACTIVE).update(
            status=self.REVOKED, revoked_at=now, revocation_reason=reason[:256])
        if done:
            self.status, self.revoked_at, self.revocation_reason = self.REVOKED, now, reason[:256]
        return bool(done)

    def earlier_of_agent(self):
        """The agent's other certificates issued no later than this one and still active: the ones a renewal
        replaced (each stays active until it runs out, in case the agent never stored its successor)."""
        return IssuedCert.objects.filter(purpose="agent", agent_id=self.agent_id, status=self.ACTIVE,
                                         issued_at__lte=self.issued_at).exclude(pk=self.pk).order_by("issued_at")

    def to_dict(self):
        return {"serial_hex": self.serial_hex, "subject": self.subject, "san": self.san, "purpose": self.purpose,
                "status": self.status, "not_after": int(self.not_after.timestamp()),
                "issued_at": int(self.issued_at.timestamp()),
                "revoked_at": int(self.revoked_at.timestamp()) if self.revoked_at else 0,
                "revocation_reason": self.revocation_reason, "issued_by": self.issued_by,
                "issuer_key_id": self.issuer_key_id}


class CrlVersionManager(models.Manager):
    def latest_published(self):
        return self.order_by("-version").first()

    def next_number(self):
        """Called under the CA row's lock (pki.ca.publish_crl): the next crlNumber."""
        assert transaction.get_connection().in_atomic_block
        last = self.order_by("-version").values_list("version", flat=True).first()
        return (last or 0) + 1


class CrlVersion(models.Model):
    version = models.PositiveBigIntegerField(primary_key=True, help_text="the crlNumber")
    der = models.BinaryField()
    this_update = models.DateTimeField()
    next_update = models.DateTimeField()
    published_at = models.DateTimeField(default=timezone.now)
    issuer_fingerprint = models.CharField(max_length=64)
    issuer_key_id = models.CharField(max_length=64)

    objects = CrlVersionManager()

    class Meta:
        verbose_name = "CRL version"

    def __str__(self):
        return f"CRL #{self.version} (next update {self.next_update:%Y-%m-%d %H:%M})"
