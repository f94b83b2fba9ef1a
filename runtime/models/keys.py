"""The deployment's model keys, who may use each, and where a model call may go.

``ModelKeys`` holds every configured key as a ``SecretStr`` (its repr is masked) and
decides, without reading a value, whether one owner's run may use a run config's
``api_key_ref`` and ``base_url``:

- **Every base URL is allow-listed**, with a key or without one: the provider's official
  endpoint plus ``AIDAWORK_MODEL_BASE_URLS``. ``base_url`` comes from whoever submits the
  run; without the allowlist a tenant could make a worker POST anywhere (server-side
  request forgery), and a key sent wherever it points would be a key handed to them.
- **Named keys belong to owners** (``AIDAWORK_MODEL_KEYS``). A run naming a key its owner
  may not use is refused with the same message whether the name exists or not, so a
  tenant can neither list the key names nor confirm a guessed key value.
- The providers' **default keys** (``AIDAWORK_OPENAI_API_KEY``,
  ``AIDAWORK_ANTHROPIC_API_KEY``) are the deployment's own and every owner may use them;
  a key meant for some owners only is a named key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pydantic import SecretStr

from runtime.config import DEFAULT_KEY_REF
from runtime.errors import ModelError, RequestInvalid
from schema.wire.errors import ErrorCode

# Where each provider's calls may always go.
OFFICIAL_BASE_URLS: Mapping[str, tuple[str, ...]] = {
    "openai": ("https://api.openai.com/v1",),
    "anthropic": ("https://api.anthropic.com",),
}
# The environment variable that holds each provider's default key (for messages only).
DEFAULT_KEY_VARIABLES: Mapping[str, str] = {
    "openai": "AIDAWORK_OPENAI_API_KEY",
    "anthropic": "AIDAWORK_ANTHROPIC_API_KEY",
}
ANY_OWNER = "*"
# One message for an unknown name, a name this owner may not use, and a guessed value.
KEY_NOT_AVAILABLE = "no model key of that name is available to this run's owner"
_DEFAULT_PORTS = {"http": 80, "https": 443}


class ModelKeyMissing(ModelError):
    """The run asks for a key (``api_key_ref``) that this worker does not have."""

    code = ErrorCode.MODEL_API_KEY_MISSING


def clean_key(value: str) -> str:
    """A key as configured, without the surrounding whitespace a key file or a shell
    often adds. It must be printable ASCII without spaces: anything else cannot be sent in
    an HTTP header, and the HTTP library's error would quote it. Never echoes the value."""
    value = value.strip()
    if not value or not all("!" <= c <= "~" for c in value):
        raise ValueError("an API key must be non-empty printable ASCII without spaces")
    return value


def normalize_base_url(url: str) -> str:
    """The form compared against the allowed base URLs: scheme and host lower-cased, the
    scheme's default port dropped, trailing slashes dropped. ``check_base_url`` has
    already refused whitespace, user info, ``?`` and ``#``; the path is compared as
    written, so ``/v1/../admin`` is not ``/v1``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    port = parts.port
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"


@dataclass(frozen=True)
class ResolvedKey:
    """The key a client sends (``None``: no key), or why the key it needs is missing."""

    value: SecretStr | None
    missing: str | None = None

    def header_value(self) -> str | None:
        return self.value.get_secret_value() if self.value is not None else None


@dataclass(frozen=True)
class NamedKey:
    """A key from ``AIDAWORK_MODEL_KEYS`` and the owners whose runs may use it
    (``"*"``: every owner, shared on purpose)."""

    value: SecretStr
    owners: frozenset[str]

    def usable_by(self, owner: str) -> bool:
        return ANY_OWNER in self.owners or owner in self.owners


@dataclass(frozen=True)
class ModelKeys:
    """The deployment's model keys: one default per provider, named keys bound to owners,
    and the base URLs (beyond the official ones) model calls may go to."""

    openai: SecretStr | None = None
    anthropic: SecretStr | None = None
    named: Mapping[str, NamedKey] = field(default_factory=dict)
    base_urls: tuple[str, ...] = ()

    def allows(self, provider: str, base_url: str) -> bool:
        target = normalize_base_url(base_url)
        allowed = (*OFFICIAL_BASE_URLS.get(provider, ()), *self.base_urls)
        return any(normalize_base_url(u) == target for u in allowed)

    def values(self) -> tuple[str, ...]:
        """Every configured key value: what the scrubber removes from provider data."""
        secrets = (self.openai, self.anthropic, *(k.value for k in self.named.values()))
        return tuple(s.get_secret_value() for s in secrets if s is not None)

    def resolve(self, provider: str, api_key_ref: str | None, base_url: str, owner: str) -> ResolvedKey:
        """The key for one owner's run config. Raises ``RequestInvalid`` for what the
        request may not do (checked at submit by ``prepare_execution`` and again by the
        worker before the run's first round); a default key that is simply not configured
        here resolves to ``missing`` and fails the call."""
        if not self.allows(provider, base_url):
            raise RequestInvalid(
                "config.model.base_url",
                f"this base_url is not allowed for {provider}: model calls go only to the official endpoint "
                f"({', '.join(OFFICIAL_BASE_URLS.get(provider, ()))}) or to a base URL the deployment lists "
                "in AIDAWORK_MODEL_BASE_URLS",
            )
        if api_key_ref is None:
            return ResolvedKey(None)
        if api_key_ref == DEFAULT_KEY_REF:
            value = self.openai if provider == "openai" else self.anthropic if provider == "anthropic" else None
            if value is None:
                variable = DEFAULT_KEY_VARIABLES.get(provider, "the provider's key variable")
                return ResolvedKey(None, missing=f"no default {provider} API key is configured ({variable} is unset)")
            return ResolvedKey(value)
        named = self.named.get(api_key_ref)
        if named is None or not named.usable_by(owner):
            raise RequestInvalid("config.model.api_key_ref", KEY_NOT_AVAILABLE)
        return ResolvedKey(named.value)
