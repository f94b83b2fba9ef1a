"""Configuration from the environment (prefix ``AIDAWORK_``). The only module that
reads the environment. Errors name the variable."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Annotated

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from runtime.config import DEFAULT_KEY_REF, KEY_REF_PATTERN, check_base_url
from runtime.models.keys import clean_key
from runtime.toolsets.mcp_config import McpServerConfig, parse_mcp_servers
from worker.ops.rate_limit_rules import RateLimit, parse_rate_limits
from worker.ops.redis_clients import parse_sentinel_url, redis_url, sentinel_url
from worker.ops.settings_values import ModelKeyEntry, json_setting, parse_api_tokens
from worker.ops.webhooks.policy import parse_prefixes

ENV_PREFIX = "AIDAWORK_"
FAILPOINTS = frozenset(
    {"after_claim", "in_model_call", "after_model_call", "in_tool_call", "after_commit", "after_enqueue"}
)
class SettingsError(Exception):
    """A setting in the environment is missing or invalid; the message names it."""


class Settings(BaseSettings):
    # hide_input_in_errors: a validation error must never print a key it was given.
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore", hide_input_in_errors=True)

    database_url: str = Field(
        default="postgresql+psycopg://postgres@127.0.0.1:5432/aidawork",
        description="The PostgreSQL database of the deployment, as an SQLAlchemy URL (psycopg driver).",
    )
    broker_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="The Celery broker (Redis); provider rate limits keep their buckets there too. Redis behind "
        "Sentinel: `sentinel://host:26379;sentinel://host2:26379/0` (every sentinel, `;`-separated; the database, "
        "user and password of the master in the first URL) with AIDAWORK_SENTINEL_MASTER.",
    )
    sentinel_master: str | None = Field(
        default=None,
        min_length=1,
        description="With a `sentinel://` broker URL (required then): the name of the Redis master group the "
        "sentinels monitor (`sentinel monitor NAME ...`). Every Redis client of every process (Celery, rate "
        "limits, deltas, the reconciler's epoch key) asks the sentinels for its current master.",
    )
    sentinel_timeout_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="With a `sentinel://` broker URL: how long a sentinel may take to connect and answer before "
        "the next one is asked for the master's address.",
    )
    secret_key: SecretStr | None = Field(
        default=None,
        min_length=16,
        description="Signs round proofs (HMAC-SHA256); every worker of a deployment needs the same value. "
        "When unset, a development value is used and a warning is logged.",
    )
    dev: bool = Field(
        default=False,
        description="Development mode: `aidawork worker`, `beat` and `api` start without a secret key "
        "(using a public development secret). Never set it in a deployment.",
    )

    lease_s: float = Field(
        default=30.0,
        gt=0.5,
        le=3600,
        description="A claim is a lease of this length, extended every lease_s / 3 while the round runs: longer "
        "than any gap between heartbeats. A worker that dies or stalls loses its runs sooner, once silent for "
        "AIDAWORK_WORKER_DEAD_AFTER_S; the lease is the backstop when beat cannot tell (not running, or just "
        "back from a database outage).",
    )
    worker_heartbeat_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="How often each worker process says it is alive in the workers registry (one small UPDATE, "
        "holding rounds or not; the leases it holds are extended in the same statement every lease_s / 3).",
    )
    worker_dead_after_s: float = Field(
        default=3.0,
        gt=0,
        le=3600,
        description="A worker silent this long (no heartbeat, never said it stopped) is dead: beat expires the "
        "leases it holds and sends its rounds to other workers at once, checking every "
        "AIDAWORK_WORKER_HEARTBEAT_S. At least twice the heartbeat. A worker that was only slow and comes back "
        "writes nothing more for those rounds (its claim fence is old): a false alarm costs a redone round.",
    )
    dispatch_grace_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="A ready run whose last task was sent this long ago without a claim is re-sent.",
    )
    reconcile_interval_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="How often beat runs the reconciler (start to start), which re-sends the round of every run that "
        "should be executing but has no live task (its lease expired, or its message was never claimed). Dead "
        "workers are looked for more often, every AIDAWORK_WORKER_HEARTBEAT_S.",
    )
    round_queues: int = Field(
        default=16,
        ge=1,
        le=256,
        description="Fair share: the number of round queues the broker rotates between. An owner of weight W "
        "sends to W of them (at most all), and owners whose queues overlap share them FIFO, so keep it well above "
        "the summed weights of the owners busy at once; every process of a deployment (workers, beat, API, CLI) "
        "must have the same value.",
    )
    max_round_attempts: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Failed executions of one round (its worker died in it, or it raised) before the run fails "
        "with ROUND_ATTEMPTS_EXHAUSTED.",
    )
    max_local_read_bytes: int = Field(
        default=1_048_576,
        ge=1,
        le=64 * 1_048_576,
        description="Largest file a client may deliver for a durable local read (UTF-8 bytes).",
    )
    worker_concurrency: int = Field(
        default=32,
        ge=1,
        le=1000,
        description="Threads per worker process: rounds wait on model I/O, so many fit in one process.",
    )
    database_pool_max: int = Field(
        default=20,
        ge=1,
        le=1000,
        description="Database connections per process: min(threads + 2, this). A round holds a connection only "
        "for one statement, so a few serve hundreds of threads; a thread finding all in use waits up to "
        "database_pool_timeout_s.",
    )
    database_pool_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="How long a thread waits for a free database connection of its process's pool.",
    )
    database_pgbouncer: bool = Field(
        default=False,
        description="Behind PgBouncer in transaction pooling mode: no server-side prepared statements.",
    )
    stock_broker: bool = Field(
        default=False,
        description="Use kombu's stock Redis transport and Celery's stock worker consumer instead of aidawork's "
        "faster ones (worker.engine.broker, worker.engine.consumer: one Redis client per channel, fair-share "
        "key order, batched intake, batched task events), which override private methods of both libraries: "
        "the switch back should a kombu or Celery release break them. Delivery guarantees are the same; the "
        "cost per round is higher (Redis commands, worker CPU), and a run's priority then also orders rounds "
        "across owners' queues (kombu serves every queue's most urgent step first). Outside the kombu and "
        "Celery versions the overrides were tested with, the stock classes are used anyway, with a "
        "`broker_overrides_disabled` warning.",
    )
    log_level: str = Field(
        default="INFO",
        pattern="^(DEBUG|INFO|WARNING|ERROR)$",
        description="The one log level of every process (worker, beat, api, flower, migrate, CLI), for our own "
        "lines and every library's alike. Client commands of the CLI log only warnings and errors whatever it "
        "says: their results are their output.",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="The port on which THIS worker process serves Prometheus /metrics (unset: no endpoint); "
        "several worker processes on one host each get their own value (8001, 8002, ...). The API serves "
        "/metrics on its own port.",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="The address the metrics endpoint listens on. Loopback by default: the endpoint has no "
        "authentication, so widen it (0.0.0.0, as compose does) only where a network policy or an "
        "authenticating proxy keeps everyone but the scraper out.",
    )
    metrics_models: str = Field(
        default="",
        description="Model names that metrics label by name (comma-separated); any other model is labelled "
        "`other`, since a run's model name is whatever its submitter sent and each label value is a series "
        "Prometheus keeps for ever.",
    )
    # OpenTelemetry traces are configured by the standard OTEL_* variables, which the SDK
    # reads itself; these four only decide whether tracing is on at all.
    otel_exporter_otlp_endpoint: str | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT",
        description="The standard OpenTelemetry OTLP endpoint (read by the SDK itself); when set, traces are "
        "exported (worker.ops.observability.tracing).",
    )
    otel_exporter_otlp_traces_endpoint: str | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        description="The standard OpenTelemetry OTLP endpoint for traces only; when set, traces are exported.",
    )
    otel_traces_exporter: str | None = Field(
        default=None,
        validation_alias="OTEL_TRACES_EXPORTER",
        description="The standard OpenTelemetry traces exporter; when set, it decides whether traces are "
        "exported (`none` turns them off even with an endpoint).",
    )
    otel_service_name: str | None = Field(
        default=None,
        validation_alias="OTEL_SERVICE_NAME",
        description="The standard OpenTelemetry service name of this process's spans (read by the SDK itself).",
    )
    worker_name: str = Field(
        default="aidawork@%h",
        pattern=r"^[A-Za-z0-9_.%-]+@[A-Za-z0-9_.%-]+$",
        description="The Celery node name of `aidawork worker` (`%h` is the host name), stable across restarts so "
        "a restarted worker is the same row in Flower. Two workers on one host need distinct names "
        "(`w1@%h`, `w2@%h`): Celery tells nodes apart by this name only.",
    )
    flower_basic_auth: SecretStr | None = Field(
        default=None,
        description="Flower's HTTP basic auth (`aidawork flower`), `user:password` (several pairs "
        "comma-separated); unset: no authentication, so only bind Flower to loopback then. Secret: never logged, "
        "passed to Flower in-process, not on a command line.",
    )
    plugins: str = Field(
        default="",
        description="Plugins to load at start, a comma-separated list of importable modules (more are found "
        "through the `aidawork.plugins` entry points of installed packages). Every process of a deployment "
        "(worker, API, CLI, client) needs the same list.",
    )
    failpoints: str = Field(
        default="",
        description="Test-only crash injection: comma-separated failpoint names, each optionally scoped to the "
        "runs of one owner (`after_model_call@team-poison`). Empty in production.",
    )

    # --- model provider keys (never logged, stored or put in a message) ----------------
    openai_api_key: SecretStr | None = Field(
        default=None,
        description='The default OpenAI key, used by runs whose model config says `"api_key_ref": "default"` '
        "(or leaves it out).",
    )
    anthropic_api_key: SecretStr | None = Field(
        default=None,
        description='The default Anthropic key, used by runs whose model config says `"api_key_ref": "default"` '
        "(or leaves it out).",
    )
    model_keys: Annotated[dict[str, SecretStr | ModelKeyEntry], NoDecode] = Field(
        default_factory=dict,
        description='More keys by name, each bound to the owners that may use it, a JSON object such as '
        '`{"team-b": {"key": "sk-...", "owners": ["team-b"]}}` (`"owners": ["*"]` shares a key on purpose; the '
        'plain form `{"team-b": "sk-..."}` is usable only by the owner named like the key); a run picks one with '
        '`"api_key_ref": "team-b"`. Processes that submit runs need the same entries.',
    )
    model_base_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Base URLs, beyond the official ones, that model calls may go to, with a key or without one "
        '(a JSON list such as `["http://vllm.internal:8000/v1"]`). A run\'s base_url comes from whoever submits '
        "it, so no call goes anywhere else.",
    )
    model_rate_limits: Annotated[dict[str, RateLimit], NoDecode] = Field(
        default_factory=dict,
        description="Provider rate limits for the whole fleet: a JSON object keyed API_KEY_REF/MODEL, either part "
        "`*` (`-`: calls that send no key), e.g. "
        '`{"default/gpt-4o-mini": {"requests_per_minute": 60, "tokens_per_minute": 100000}}`, with optional '
        "request_burst / token_burst (an idle bucket's allowance at once; default one second's worth). Kept in "
        "the broker's Redis, so every worker needs the same value; unset: no limits, and no Redis call before a "
        "model call.",
    )
    model_rate_limit_max_sleep_s: float = Field(
        default=1.0,
        ge=0,
        le=60,
        description="A round told to wait for its rate limit sleeps in its thread while its waits add up to at "
        "most this; a longer wait gives the round back, re-sent with a countdown of the wait.",
    )

    mcp_servers: Annotated[dict[str, McpServerConfig], NoDecode] = Field(
        default_factory=dict,
        description="MCP servers whose tools this process offers as `mcp__<server>__<tool>`: a JSON object "
        '`{name: {"command": ..., "args": [...], "env": {...}}}` (stdio) or `{name: {"url": ..., "headers": '
        '{...}}}` (streamable HTTP), each optionally with `"effects": {tool: "read_only" | "idempotent" | '
        '"at_most_once"}` and `"timeout_s"`. Env values and headers are secrets: never logged or echoed.',
    )

    # --- HTTP API (`aidawork api`) ----------------------------------------------------
    api_tokens: SecretStr | None = Field(
        default=None,
        description="The HTTP API's tokens, a JSON object `{token: owner}`, one entry per upstream service "
        "(several tokens may share an owner, for rotation); a token sees only its owner's runs. Secret: never "
        "logged, and refused values are not echoed.",
    )
    api_max_body_bytes: int = Field(
        default=2 * 1_048_576,
        ge=1024,
        le=256 * 1_048_576,
        description="Request bodies above this are refused with 413 before they are parsed.",
    )
    api_events_poll_s: float = Field(
        default=0.25,
        gt=0,
        le=60,
        description="How often the API process's one poller reads run_events for all its open streams.",
    )
    api_keepalive_s: float = Field(
        default=15.0,
        gt=0,
        le=3600,
        description="A comment line on an idle event stream this often, so proxies keep it open and a closed "
        "connection is noticed.",
    )
    api_header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="A connection whose request headers have not all arrived this long after it opened (or after "
        "its previous response) is closed, so a client that dribbles headers cannot hold a connection slot.",
    )
    api_body_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="A request body must arrive within this plus one second per api_body_min_bytes_per_s "
        "received; else 408 and the connection is closed. The defaults let a full 2 MiB body take 42 s and "
        "refuse a trickle of a few bytes after 10 s.",
    )
    api_body_min_bytes_per_s: int = Field(
        default=65_536,
        ge=1,
        le=1 << 30,
        description="The body rate that earns a request one more second beyond api_body_timeout_s.",
    )
    api_max_connections: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="Connections served at once by one API process; a request on a further connection gets 503 "
        "and that connection is closed.",
    )
    api_max_streams_per_token: int = Field(
        default=8,
        ge=1,
        le=100_000,
        description="Open event streams per token; one more gets 429 until one of them ends.",
    )
    api_docs: bool = Field(
        default=True,
        description="Serve /docs, /redoc and /openapi.json (turn off for an internet-facing API).",
    )
    api_cors_origins: str = Field(
        default="",
        description="Browser origins allowed to call the API (CORS), comma-separated, e.g. "
        '"https://ops.example.com,http://localhost:5173". Unset: no CORS headers at all (the inspector at /ui is '
        "same-origin and needs none).",
    )
    api_stream_token_ttl_s: int = Field(
        default=300,
        ge=10,
        le=3600,
        description="Lifetime of a stream token (POST /v1/runs/{id}/stream-token): what a browser's EventSource, "
        "which cannot send a bearer header, shows the event stream instead.",
    )

    # --- webhooks (worker.ops.webhooks; the `aidawork webhooks` process delivers them) -------
    webhook_urls: str = Field(
        default="",
        description='URL prefixes a run\'s `"webhook": {"url": ...}` may start with, comma-separated, http:// or '
        "https:// only (a prefix without a path matches that host only); empty: a run with a webhook is refused. "
        "Every process that submits runs needs the same list.",
    )
    webhook_secret: SecretStr | None = Field(
        default=None,
        min_length=16,
        description="Signs every delivery (AIDAWORK-Signature); required when webhook_urls is set, and by "
        "`aidawork webhooks`. Shared with the receivers; never logged.",
    )
    webhook_retry_for_s: float = Field(
        default=86_400.0,
        gt=0,
        le=30 * 86_400,
        description="A delivery not answered with a 2xx is retried for this long after its event, then marked "
        "failed.",
    )
    webhook_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="Each delivery attempt's timeout (connect, and each read or write); redirects are not "
        "followed.",
    )
    webhook_backoff_s: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="Backoff between delivery attempts: base, 2 x base, 4 x base, ... up to "
        "webhook_backoff_max_s, with jitter.",
    )
    webhook_backoff_max_s: float = Field(
        default=3600.0,
        gt=0,
        le=86_400,
        description="The longest backoff between delivery attempts.",
    )
    webhook_concurrency: int = Field(
        default=8,
        ge=1,
        le=256,
        description="Deliveries in flight at once per `aidawork webhooks` process: a slow receiver holds one of "
        "them, not the others.",
    )
    webhook_poll_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="The deliverer wakes on NOTIFY at once and also polls this often (behind PgBouncer, or when "
        "its LISTEN connection was lost, the poll is what finds new deliveries).",
    )
    idempotency_ttl_s: int = Field(
        default=86_400,
        ge=1,
        le=365 * 86_400,
        description="A run request's idempotency_key (or Idempotency-Key header) returns the run first stored "
        "with it for at least this long; an older key is cleared from its run by the next submit with it, which "
        "then stores a new run.",
    )

    # --- retention (worker.ops.retention: beat prunes on its own; `aidawork prune` on demand) -
    retention_days: float | None = Field(
        default=None,
        gt=0,
        le=36_500,
        description="A Root whose runs have all ended more than this many days ago is deleted with every row it "
        "owns (rule: schema.store.retention); unset: everything is kept forever. Fractions are allowed; keep it "
        "longer than AIDAWORK_WEBHOOK_RETRY_FOR_S and the idempotency TTL, as a pruned run no longer answers a "
        "retried submit.",
    )
    retention_interval_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="How often beat runs a retention pass (start to start); a pass deletes batches until one "
        "comes back short.",
    )
    retention_batch_runs: int = Field(
        default=500,
        ge=1,
        le=10_000,
        description="Expired runs one retention batch scans (one transaction each); their Roots go whole, so a "
        "batch deletes at most this many Roots and about this many runs.",
    )

    @field_validator("webhook_secret", mode="before")
    @classmethod
    def _unset_if_empty(cls, value: object) -> object:
        # docker compose passes an unset ${VAR:-} as "": that means no secret, not a short one.
        return None if value == "" else value

    @field_validator("retention_days", mode="before")
    @classmethod
    def _retention_unset_if_empty(cls, value: object) -> object:
        # docker compose passes an unset ${VAR:-} as "": keep forever, not an invalid number.
        return None if value == "" else value

    @field_validator("webhook_urls")
    @classmethod
    def _webhook_prefixes(cls, value: str) -> str:
        parse_prefixes(value)
        return value

    @model_validator(mode="after")
    def _webhook_secret_required(self) -> Settings:
        if self.webhook_prefixes and self.webhook_secret is None:
            raise ValueError(
                f"{ENV_PREFIX}WEBHOOK_SECRET must be set (16+ characters) when {ENV_PREFIX}WEBHOOK_URLS is"
            )
        return self

    @property
    def webhook_prefixes(self) -> list[str]:
        return parse_prefixes(self.webhook_urls)

    @field_validator("failpoints")
    @classmethod
    def _known_failpoints(cls, value: str) -> str:
        unknown = {p.strip().partition("@")[0] for p in value.split(",") if p.strip()} - FAILPOINTS
        if unknown:
            raise ValueError(f"unknown failpoints {sorted(unknown)} (known: {sorted(FAILPOINTS)})")
        return value

    @field_validator("flower_basic_auth")
    @classmethod
    def _user_password_pairs(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            pairs = value.get_secret_value().split(",")
            if not all(user and password for user, _, password in (p.partition(":") for p in pairs)):
                raise ValueError("expected user:password (several comma-separated)")
        return value

    @field_validator("api_tokens")
    @classmethod
    def _token_map(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            parse_api_tokens(value.get_secret_value())
        return value

    @property
    def tracing_enabled(self) -> bool:
        """Traces are exported only when an OTLP endpoint or a traces exporter is named
        (OTEL_TRACES_EXPORTER=none turns them off again)."""
        if self.otel_traces_exporter is not None:
            return self.otel_traces_exporter.strip().lower() not in ("", "none")
        return bool(self.otel_exporter_otlp_endpoint or self.otel_exporter_otlp_traces_endpoint)

    @property
    def api_token_owners(self) -> dict[str, str]:
        """token -> owner; empty when the API has no tokens configured."""
        return {} if self.api_tokens is None else parse_api_tokens(self.api_tokens.get_secret_value())

    @field_validator("openai_api_key", "anthropic_api_key")
    @classmethod
    def _clean_key(cls, value: SecretStr | None) -> SecretStr | None:
        return None if value is None else SecretStr(clean_key(value.get_secret_value()))

    @field_validator("model_keys", mode="before")
    @classmethod
    def _key_json(cls, value: object) -> object:
        parsed = json_setting(value, '{"name": {"key": "...", "owners": ["owner"]}}')
        return {} if parsed is None else parsed

    @field_validator("model_keys")
    @classmethod
    def _key_names(cls, value: dict[str, SecretStr | ModelKeyEntry]) -> dict[str, SecretStr | ModelKeyEntry]:
        for name in value:
            if not re.fullmatch(KEY_REF_PATTERN, name) or name == DEFAULT_KEY_REF or name.lower().startswith("sk-"):
                raise ValueError(
                    f"key names match {KEY_REF_PATTERN}, do not start with 'sk-' and are not {DEFAULT_KEY_REF!r}"
                )
        return {
            name: SecretStr(clean_key(entry.get_secret_value()))
            if isinstance(entry, SecretStr)
            else ModelKeyEntry(key=SecretStr(clean_key(entry.key.get_secret_value())), owners=entry.owners)
            for name, entry in value.items()
        }

    @field_validator("model_base_urls", mode="before")
    @classmethod
    def _url_json(cls, value: object) -> object:
        parsed = json_setting(value, '["https://host/v1", ...]')
        return [] if parsed is None else parsed

    @field_validator("model_base_urls")
    @classmethod
    def _http_urls(cls, value: list[str]) -> list[str]:
        return [check_base_url(url) for url in value]

    @field_validator("model_rate_limits", mode="before")
    @classmethod
    def _rate_limits_json(cls, value: object) -> dict[str, RateLimit]:
        return parse_rate_limits(json_setting(value, '{"API_KEY_REF/MODEL": {"requests_per_minute": N}}'))

    @model_validator(mode="after")
    def _dead_after_outlasts_heartbeats(self) -> Settings:
        # One late heartbeat (a busy database, a GC pause) must not read as a death.
        if self.worker_dead_after_s < 2 * self.worker_heartbeat_s:
            raise ValueError(
                f"{ENV_PREFIX}WORKER_DEAD_AFTER_S must be at least twice {ENV_PREFIX}WORKER_HEARTBEAT_S"
            )
        return self

    @model_validator(mode="after")
    def _sentinel_needs_master(self) -> Settings:
        if sentinel_url(self.broker_url):
            if self.sentinel_master is None:
                raise ValueError(
                    f"a sentinel:// {ENV_PREFIX}BROKER_URL needs {ENV_PREFIX}SENTINEL_MASTER, the name of the "
                    "master group its sentinels monitor"
                )
            parse_sentinel_url(self.broker_url)  # a ValueError names what is wrong
        return self

    @model_validator(mode="after")
    def _rate_limits_need_redis(self) -> Settings:
        if self.model_rate_limits and not redis_url(self.broker_url):
            raise ValueError(f"{ENV_PREFIX}MODEL_RATE_LIMITS needs a Redis broker (its buckets live there)")
        return self

    @field_validator("mcp_servers", mode="before")
    @classmethod
    def _mcp_json(cls, value: object) -> dict[str, McpServerConfig]:
        return parse_mcp_servers(json_setting(value, '{"name": {"command": "...", "args": [...]} or {"url": "..."}}'))

    @property
    def named_model_keys(self) -> dict[str, tuple[SecretStr, list[str]]]:
        """``AIDAWORK_MODEL_KEYS`` as (key, owners): a plain key belongs to its name."""
        return {
            name: (entry, [name]) if isinstance(entry, SecretStr) else (entry.key, entry.owners)
            for name, entry in self.model_keys.items()
        }

    def secret_problem(self) -> str | None:
        """Why a worker, beat or API process must not start, or None. Without the secret
        every deployment would sign round proofs with the same public development value,
        so anyone able to write to the database could forge them."""
        if self.secret_key is None and not self.dev:
            return (
                "AIDAWORK_SECRET_KEY is not set: give every worker, beat and API process of the deployment "
                "the same random value of at least 16 characters (or set AIDAWORK_DEV=1 for local development)"
            )
        return None

    @property
    def metrics_model_names(self) -> frozenset[str]:
        return frozenset(m.strip() for m in self.metrics_models.split(",") if m.strip())

    @property
    def cors_origins(self) -> list[str]:
        return [o.strip() for o in self.api_cors_origins.split(",") if o.strip()]

    @property
    def plugin_names(self) -> list[str]:
        return [p.strip() for p in self.plugins.split(",") if p.strip()]

    @property
    def failpoint_set(self) -> frozenset[str]:
        return frozenset(p.strip() for p in self.failpoints.split(",") if p.strip())

    @property
    def retention_s(self) -> float | None:
        """AIDAWORK_RETENTION_DAYS in seconds; None: keep forever."""
        return None if self.retention_days is None else self.retention_days * 86_400

    @property
    def lease_renew_s(self) -> float:
        """How often a worker extends the leases it holds (its heartbeat carries them)."""
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
