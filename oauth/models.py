"""What yuzu keeps beside django-oauth-toolkit's clients and grants.

- ``ClientState``: a registered client (DOT's Application) that an administrator revoked stays revoked, also when
  its client metadata document would register it again.
- ``Authorization``: one person's consent for one client on one MCP endpoint: the tier, the expiry (≤ 90 days), and
  the API token it issues. The access token IS that ApiToken (hashed, tiered, audited, revocable, listed by
  list_api_tokens); each refresh replaces its secret and pushes its short expiry on, so it stays one row (and one
  MCP principal) for the life of the connection. The refresh tokens are DOT's, rotated on every use, in one family.
"""

import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone
from oauth2_provider.models import get_refresh_token_model
from oauth2_provider.settings import oauth2_settings

from yuzu.audit import audit
from yuzu.auth import OAUTH_RESOURCES
from yuzu.models import MCP_TIERS, TOKEN_PREFIX, AccountLockout, ApiToken, hash_secret, new_hex_id


class ClientState(models.Model):
    application = models.OneToOneField(oauth2_settings.APPLICATION_MODEL, on_delete=models.CASCADE,
                                       related_name="yuzu_state")
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True)

    @classmethod
    def is_revoked(cls, client_id):
        return cls.objects.filter(application__client_id=client_id, revoked_at__isnull=False).exists()


class Authorization(models.Model):
    AUDIENCES = [(a, f"{path}/") for a, path in OAUTH_RESOURCES.items()]

    id = models.CharField(primary_key=True, max_length=24, default=new_hex_id, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oauth_authorizations")
    application = models.ForeignKey(oauth2_settings.APPLICATION_MODEL, on_delete=models.CASCADE,
                                    related_name="yuzu_authorizations", verbose_name="client")
    audience = models.CharField(max_length=16, choices=AUDIENCES, verbose_name="endpoint")
    resource = models.CharField(max_length=255, help_text="The resource indicator the client asked for (RFC 8707)")
    mcp_tier = models.CharField(max_length=16, choices=[(t, t) for t in MCP_TIERS])
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(help_text="End of the consent: no token is issued or refreshed after it")
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.CharField(max_length=64, blank=True)
    code_hash = models.CharField(max_length=64, unique=True, null=True, editable=False)
    token_family = models.UUIDField(null=True, blank=True, db_index=True, editable=False)
    api_token = models.OneToOneField(ApiToken, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="oauth_authorization", verbose_name="access token")

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "OAuth connection"

    def __str__(self):
        return f"{self.user} → {self.application} ({self.mcp_tier}, {self.get_audience_display()})"

    def problem(self, now=None):
        """Why no token may be issued or refreshed for this consent now, or None."""
        now = now or timezone.now()
        if self.revoked_at is not None:
            return f"revoked ({self.revoked_reason})"
        if self.expires_at <= now:
            return "expired"
        if not self.user.is_active:
            return "user inactive"
        if AccountLockout.holds_out(self.user, now):
            return "user locked"  # refused while it holds; revokes nothing, so the connection goes on once lifted
        if self.api_token is not None and self.api_token.revoked_at is not None:
            return "access token revoked"
        if ClientState.is_revoked(self.application.client_id):
            return "client revoked"
        return None

    def access_seconds(self, now=None):
        remaining = (self.expires_at - (now or timezone.now())).total_seconds()
        return max(1, int(min(settings.YUZU_OAUTH_ACCESS_TOKEN_SECONDS, remaining)))

    def issue_access_token(self, expires, now=None):
        """The raw access token. The first for a consent mints the connection's ApiToken — or, when the same person
        already connected the same client to the same endpoint (a re-authorization, a step-up to another tier), takes
        that connection's token over, so the client's MCP session and bridge state (keyed by the token) carry on.
        A refresh replaces the token's secret (the previous one stops working) and pushes its expiry on. Never past
        the consent's end."""
        now = now or timezone.now()
        expires = min(expires, self.expires_at)
        raw = TOKEN_PREFIX + secrets.token_hex(32)
        if self.api_token is None:
            # One first issue per person at a time (their row locked until the issuing transaction commits): two
            # consents exchanged at once each found no earlier connection and both minted, leaving two.
            type(self.user).objects.select_for_update().filter(pk=self.user_id).first()
            previous = (Authorization.objects.filter(user=self.user, application=self.application,
                                                     audience=self.audience, revoked_at__isnull=True,
                                                     api_token__revoked_at__isnull=True)
                        .exclude(pk=self.pk).exclude(api_token=None).select_related("api_token").first())
            if previous is None:
                token, raw = ApiToken.mint(self.user, self.token_name(), mcp_tier=self.mcp_tier, expires_at=expires,
                                           audience=self.audience, now=now)
                action = "api_token.create"
            else:
                token = previous.api_token
                Authorization.objects.filter(pk=previous.pk).update(api_token=None)
                previous.api_token = None
                previous.revoke("superseded by a new consent")
                ApiToken.objects.filter(pk=token.pk).update(token_hash=hash_secret(raw), prefix=raw[:12],
                                                            expires_at=expires, mcp_tier=self.mcp_tier,
                                                            name=self.token_name())
                action = "oauth.token.reissue"
            self.api_token = token
            self.save(update_fields=["api_token"])
            audit(self.user, action, "success", target_type="ApiToken", target_id=token.id,
                  detail=f"via=oauth authorization={self.pk} client={self.application.client_id} "
                         f"mcp_tier={self.mcp_tier} endpoint={OAUTH_RESOURCES[self.audience]}/")
            return raw
        renewed = ApiToken.objects.filter(pk=self.api_token_id, revoked_at__isnull=True).update(
            token_hash=hash_secret(raw), prefix=raw[:12], expires_at=expires)
        if not renewed:
            raise ValueError("the connection's access token was revoked")
        audit(self.user, "oauth.token.refresh", "success", target_type="ApiToken", target_id=self.api_token_id,
              detail=f"authorization={self.pk} client={self.application.client_id}")
        return raw

    def token_name(self):
        client = printable(self.application.name, 64) or "OAuth client"
        return f"{client} (OAuth, {OAUTH_RESOURCES[self.audience]}/, until {self.expires_at:%Y-%m-%d})"

    def revoke(self, reason, by="system"):
        """End the connection: its access token and every refresh token of its family stop working. Idempotent."""
        now = timezone.now()
        with transaction.atomic():
            if not Authorization.objects.filter(pk=self.pk, revoked_at__isnull=True).update(
                    revoked_at=now, revoked_reason=reason[:64]):
                return False
            self.revoked_at, self.revoked_reason = now, reason[:64]
            # In the order a refresh locks them — its refresh token, then the access token's row — or the two wait
            # for each other (PostgreSQL aborts one as a deadlock). A refresh token that refresh issues meanwhile
            # survives the family's revocation, and is refused by this row's revoked_at.
            if self.token_family:
                get_refresh_token_model().revoke_family(self.token_family)
            if self.api_token_id:
                ApiToken.objects.filter(pk=self.api_token_id, revoked_at__isnull=True).update(revoked_at=now)
        audit(by, "oauth.authorization.revoke", "success", target_type="OAuthAuthorization", target_id=self.pk,
              detail=f"reason={reason} user={self.user.get_username()} client={self.application.client_id} "
                     f"token={self.api_token_id or '-'}")
        return True

    @classmethod
    def consent(cls, user, application, *, audience, resource, tier, days, now=None):
        now = now or timezone.now()
        return cls.objects.create(user=user, application=application, audience=audience, resource=resource,
                                  mcp_tier=tier, created_at=now, expires_at=now + timedelta(days=days))


def printable(value, limit):
    """Client-supplied text for display: printable characters only, bounded."""
    return "".join(c for c in value if c.isprintable())[:limit].strip() if isinstance(value, str) else ""
