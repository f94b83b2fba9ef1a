"""Configuration from the environment (prefix ``AIDAWORK_``). The only module that
reads the environment. Errors name the variable."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "AIDAWORK_"
FAILPOINTS = frozenset({"after_claim", "after_model_call", "in_tool", "after_commit", "after_enqueue"})


class SettingsError(Exception):
    """A setting in the environment is missing or invalid; the message names it."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    database_url: str = "postgresql+psycopg://postgres@127.0.0.1:5432/aidawork"
    broker_url: str = "redis://127.0.0.1:6379/0"
    # Signs round proofs (HMAC-SHA256). Every worker of a deployment needs the same value;
    # when unset, a development value is used and a warning is logged.
    secret_key: SecretStr | None = Field(default=None, min_length=16)

    # A claim is a lease of this length, extended every lease_s / 3 while the round runs.
    # Longer than any gap between heartbeats, short enough that a crashed worker's run
    # is picked up again quickly.
    lease_s: float = Field(default=30.0, gt=0.5, le=3600)
    # A ready run whose last task was sent this long ago without a claim is re-sent.
    dispatch_grace_s: float = Field(default=30.0, gt=0, le=3600)
    reconcile_interval_s: float = Field(default=5.0, gt=0, le=3600)
    # Claims of one round before the run fails with ROUND_ATTEMPTS_EXHAUSTED.
    max_round_attempts: int = Field(default=3, ge=1, le=100)
    # Largest file a client may deliver for a durable local read (UTF-8 bytes).
    max_local_read_bytes: int = Field(default=1_048_576, ge=1, le=64 * 1_048_576)
    # Threads per worker process: rounds wait on model I/O, so many fit in one process.
    worker_concurrency: int = Field(default=32, ge=1, le=1000)
    log_level: str = Field(default="INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")
    # Test-only crash injection: comma-separated names from FAILPOINTS. Empty in production.
    failpoints: str = ""

    @field_validator("failpoints")
    @classmethod
    def _known_failpoints(cls, value: str) -> str:
        unknown = {p.strip() for p in value.split(",") if p.strip()} - FAILPOINTS
        if unknown:
            raise ValueError(f"unknown failpoints {sorted(unknown)} (known: {sorted(FAILPOINTS)})")
        return value

    @property
    def failpoint_set(self) -> frozenset[str]:
        return frozenset(p.strip() for p in self.failpoints.split(",") if p.strip())

    @property
    def heartbeat_interval_s(self) -> float:
        return self.lease_s / 3


def load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            name = f"{ENV_PREFIX}{field.upper()}" if field else "settings"
            problems.append(f"{name}: {err['msg']}")
        raise SettingsError("invalid configuration: " + "; ".join(problems)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()
