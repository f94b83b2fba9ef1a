"""The one error base of the project and the one catalogue of its error codes. Both live
in ``schema.wire`` so that the store, the core (which may import ``schema.wire``, and
nothing else of ``schema``) and the worker share them.

Every error carries a stable ``code`` (what a client or operator matches on) and says
whether retrying the same thing can help (``retryable``). Every code the system can
return, whether raised, stored as a run's or a tool call's error, or sent by the HTTP API,
is a member of ``ErrorCode``; ``tests/unit/test_error_catalogue.py`` fails on a code
that is not (a plugin's own ``ToolFailed`` subclass may still name its own code: that
code is the plugin's, not ours).
"""

from __future__ import annotations

from enum import StrEnum

# What ``aidawork`` exits with (``worker.cli.main``): 2 for bad input, 1 for anything else.
_EXIT_INPUT, _EXIT_ERROR = 2, 1


class ErrorCode(StrEnum):
    """Every error code AIDAWORK returns: in an HTTP refusal's ``error.code``, as a run's
    ``error_code``, or in a failed tool result's ``error.code``."""

    # Each member has its meaning (one sentence for a user), whether retrying can help, its
    # HTTP status and its CLI exit code.
    #
    # ``http_status``: the status the API answers with. A code the API never sends (a
    # run's or a tool call's ending) has the status the API's rule gives an error it did not
    # expect (``worker.api.errors.refusal_of``): 503 if retryable, else 500.
    #
    # ``exit_code``: what ``aidawork`` exits with when a command stops on this code: 2 for
    # bad input, 1 for anything else; a code no command stops on (only the HTTP API sends
    # it, or only a run or a tool call ends with it) has 1. ``aidawork status`` and
    # ``watch`` exit 0 for a run that ended with any code.
    #
    # A member compares equal to its string, so stored values and JSON are the strings.

    meaning: str
    retryable: bool
    http_status: int
    exit_code: int

    def __new__(cls, value: str, meaning: str, retryable: bool, http_status: int, exit_code: int) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        member.retryable = retryable
        member.http_status = http_status
        member.exit_code = exit_code
        return member

    @classmethod
    def lookup(cls, value: str) -> ErrorCode | None:
        """The member whose value is ``value``, or None (``ErrorCode(value)`` raises
        instead, and type checkers read it as the members' constructor)."""
        member = cls._value2member_map_.get(value)
        return member if isinstance(member, cls) else None

    # --- the bases of the error families (raised as such only by a bug) ----------------

    AIDAWORK_ERROR = (
        "AIDAWORK_ERROR", "An error of this project that no more specific code names.", False, 500, _EXIT_ERROR,
    )
    MODEL_ERROR = (
        "MODEL_ERROR", "The model call did not produce a usable response, for a reason no more specific code names.",
        False, 500, _EXIT_ERROR,
    )

    # --- a request refused before anything is stored ---------------------------------

    REQUEST_INVALID = (
        "REQUEST_INVALID",
        "A field of the request (or a delivery, prerequisite or answer) cannot be executed or stored as written; "
        "`field` names it (HTTP 400 for a Last-Event-ID header that is not an event seq).",
        False, 422, _EXIT_INPUT,
    )
    WEBHOOK_REFUSED = (
        "WEBHOOK_REFUSED",
        "The run's webhook.url is not http(s) or not under one of the deployment's AIDAWORK_WEBHOOK_URLS prefixes.",
        False, 422, _EXIT_INPUT,
    )
    RUN_NOT_FOUND = ("RUN_NOT_FOUND", "There is no such run for this owner.", False, 404, _EXIT_INPUT)
    ROOT_NOT_FOUND = (
        "ROOT_NOT_FOUND",
        "There is no such Root for this owner (HTTP 422 when a submission's root_id names it).",
        False, 404, _EXIT_INPUT,
    )
    AGENT_NOT_FOUND = (
        "AGENT_NOT_FOUND",
        "This owner has no saved agent of that name (or not that version, or it was deleted).",
        False, 404, _EXIT_INPUT,
    )
    AGENT_EXISTS = (
        "AGENT_EXISTS",
        "This owner already has a saved agent of that name: update it to make a new version.",
        False, 409, _EXIT_INPUT,
    )
    IDEMPOTENCY_KEY_REUSED = (
        "IDEMPOTENCY_KEY_REUSED",
        "This owner already used the idempotency key, within its time to live, for a different request.",
        False, 409, _EXIT_INPUT,
    )
    ROOT_BUSY = (
        "ROOT_BUSY", "A submission with root_policy reject found an active run in its Root.", False, 409, _EXIT_INPUT,
    )
    DELIVERY_REFUSED = (
        "DELIVERY_REFUSED",
        "The run is not waiting for this input, or the input is not what it asked for; nothing was stored.",
        False, 409, _EXIT_INPUT,
    )
    RUN_ENDED = ("RUN_ENDED", "The run has already ended, so it cannot be cancelled.", False, 409, _EXIT_INPUT)
    OWNER_LIMITS_INVALID = (
        "OWNER_LIMITS_INVALID", "An owner's limits change cannot be stored; `field` names the value.",
        False, 500, _EXIT_INPUT,
    )
    PLUGIN_INVALID = (
        "PLUGIN_INVALID", "A plugin could not be loaded (its import failed, or it registered something invalid).",
        False, 500, _EXIT_INPUT,
    )
    CASE_INVALID = (
        "CASE_INVALID",
        "An exported case (aidawork replay) cannot be read: not JSON, not the aidawork.case/1 format, or a field "
        "of the wrong shape; nothing was replayed.",
        False, 500, _EXIT_INPUT,
    )
    CASE_TAMPERED = (
        "CASE_TAMPERED",
        "A digest, proof or the digest chain of an exported case does not verify: the case was changed after "
        "export; the message names the round. Nothing was replayed.",
        False, 500, _EXIT_INPUT,
    )
    EXPORT_REFUSED = (
        "EXPORT_REFUSED",
        "The run cannot be exported as a self-contained case (its context was rebuilt, or its messages were "
        "dropped by a rollback); nothing was written.",
        False, 500, _EXIT_INPUT,
    )
    TOOLSET_UNAVAILABLE = (
        "TOOLSET_UNAVAILABLE",
        "An MCP server whose tools the run enables cannot be reached now; the request itself is fine.",
        True, 503, _EXIT_ERROR,
    )
    SCHEMA_INCOMPATIBLE = (
        "SCHEMA_INCOMPATIBLE",
        "This code's compatibility level and the database schema's do not match: a worker older than the schema "
        "refuses to start (or stops claiming), and `aidawork migrate` refuses a migration that would break live "
        "workers unless --force.",
        True, 503, _EXIT_ERROR,
    )

    # --- the HTTP API's own refusals ---------------------------------------------------

    BODY_INVALID = ("BODY_INVALID", "The request body is not JSON, or not UTF-8.", False, 400, _EXIT_INPUT)
    BODY_REFUSED = (
        "BODY_REFUSED", "The request body was refused before it was parsed.", False, 400, _EXIT_ERROR,
    )
    BODY_TOO_LARGE = (
        "BODY_TOO_LARGE", "The request body is larger than AIDAWORK_API_MAX_BODY_BYTES.", False, 413, _EXIT_ERROR,
    )
    BODY_TIMEOUT = (
        "BODY_TIMEOUT",
        "The request body did not arrive in time (AIDAWORK_API_BODY_TIMEOUT_S, AIDAWORK_API_BODY_MIN_BYTES_PER_S).",
        True, 408, _EXIT_ERROR,
    )
    HTTP_400 = (
        "HTTP_400", "The request body could not be read, for a reason BODY_INVALID does not name.",
        False, 400, _EXIT_ERROR,
    )
    UNAUTHENTICATED = (
        "UNAUTHENTICATED", "The bearer token (or the stream token) is missing, unknown or expired.",
        False, 401, _EXIT_ERROR,
    )
    OWNER_MISMATCH = (
        "OWNER_MISMATCH", "The submission names another owner than the token's: omit owner, or send that one.",
        False, 403, _EXIT_ERROR,
    )
    NOT_FOUND = ("NOT_FOUND", "There is no such path in the API.", False, 404, _EXIT_ERROR)
    METHOD_NOT_ALLOWED = (
        "METHOD_NOT_ALLOWED", "The path does not take this method; the Allow header lists those it takes.",
        False, 405, _EXIT_ERROR,
    )
    TOO_MANY_STREAMS = (
        "TOO_MANY_STREAMS",
        "This token has AIDAWORK_API_MAX_STREAMS_PER_TOKEN event streams open; retry when one of them ends.",
        True, 429, _EXIT_ERROR,
    )
    INTERNAL_ERROR = (
        "INTERNAL_ERROR", "The server failed to answer because of a bug; it was logged (request_crashed).",
        False, 500, _EXIT_ERROR,
    )
    DATABASE_UNAVAILABLE = (
        "DATABASE_UNAVAILABLE", "PostgreSQL cannot be reached; retry later.", True, 503, _EXIT_ERROR,
    )

    # --- a model call that ended the run (or the round) --------------------------------

    MODEL_UNAVAILABLE = (
        "MODEL_UNAVAILABLE",
        "The model provider could not be reached, or failed transiently past the call's retries and timeout.",
        True, 503, _EXIT_ERROR,
    )
    MODEL_RATE_LIMITED = (
        "MODEL_RATE_LIMITED",
        "The round waits for its model rate limit; it is given back and sent again later (it ends no run).",
        True, 503, _EXIT_ERROR,
    )
    MODEL_REQUEST_REFUSED = (
        "MODEL_REQUEST_REFUSED",
        "The model provider refused the request (a bad model name, key or parameter); the same request cannot succeed.",
        False, 500, _EXIT_ERROR,
    )
    MODEL_RESPONSE_INVALID = (
        "MODEL_RESPONSE_INVALID",
        "The model provider answered with something that is not a usable response, or one that cannot be stored.",
        False, 500, _EXIT_ERROR,
    )
    MODEL_API_KEY_MISSING = (
        "MODEL_API_KEY_MISSING", "The run asks for a model API key (api_key_ref) that the worker does not have.",
        False, 500, _EXIT_ERROR,
    )
    MODEL_INPUT_REJECTED = (
        "MODEL_INPUT_REJECTED",
        "The model's context window cannot take the input; the context is rebuilt rather than the run failed.",
        False, 500, _EXIT_ERROR,
    )
    MODEL_OUTPUT_TRUNCATED = (
        "MODEL_OUTPUT_TRUNCATED", "The model's answer (or a tool call of it) was cut off by the output token limit.",
        False, 500, _EXIT_ERROR,
    )
    MODEL_REFUSED = ("MODEL_REFUSED", "The model refused to answer.", False, 500, _EXIT_ERROR)
    MODEL_CONTENT_FILTERED = (
        "MODEL_CONTENT_FILTERED", "The provider's content filter stopped the model's answer.", False, 500, _EXIT_ERROR,
    )
    MODEL_TOOL_CALL_UNSUPPORTED = (
        "MODEL_TOOL_CALL_UNSUPPORTED", "The model made a kind of tool call that is not run (not a function call).",
        False, 500, _EXIT_ERROR,
    )
    MODEL_SCRIPT_EXHAUSTED = (
        "MODEL_SCRIPT_EXHAUSTED", "The scripted model was asked for a turn beyond the end of its script.",
        False, 500, _EXIT_ERROR,
    )
    MODEL_TOOL_CALL_ID_REUSED = (
        "MODEL_TOOL_CALL_ID_REUSED", "The model reused the id of a tool call of an earlier round of the run.",
        False, 500, _EXIT_ERROR,
    )
    OWNER_BUDGET_EXCEEDED = (
        "OWNER_BUDGET_EXCEEDED",
        "The owner's token budget for the window cannot take the next model call, and its on_budget is fail.",
        False, 500, _EXIT_ERROR,
    )
    OWNER_BUDGET_WAIT = (
        "OWNER_BUDGET_WAIT",
        "The owner's token budget cannot take the next model call; the run waits (suspended) for the next window.",
        True, 503, _EXIT_ERROR,
    )

    # --- context rebuilds ----------------------------------------------------------------

    MODEL_CONTEXT_REBUILD_EXHAUSTED = (
        "MODEL_CONTEXT_REBUILD_EXHAUSTED",
        "The context is still too large for the model after the two rebuilds allowed, or there is nothing to compress.",
        False, 500, _EXIT_ERROR,
    )
    RUNTIME_WORK_MODEL_REBUILD_SOURCE_CHANGED = (
        "RUNTIME_WORK_MODEL_REBUILD_SOURCE_CHANGED",
        "The messages a context rebuild was prepared from changed before it was stored.",
        False, 500, _EXIT_ERROR,
    )
    MODEL_REBUILD_PREDECESSOR_MISMATCH = (
        "MODEL_REBUILD_PREDECESSOR_MISMATCH",
        "A second context rebuild did not build on the first one of its chain.",
        False, 500, _EXIT_ERROR,
    )

    # --- how a run ended, other than with its model's answer -----------------------------

    MAX_ROUNDS_EXCEEDED = (
        "MAX_ROUNDS_EXCEEDED", "The run reached its config.policy.max_rounds without a final answer.",
        False, 500, _EXIT_ERROR,
    )
    REPEATED_IDENTICAL_TOOL_CALL = (
        "REPEATED_IDENTICAL_TOOL_CALL",
        "The model repeated the same tool calls with the same results config.policy.repeated_tool_call_limit times.",
        False, 500, _EXIT_ERROR,
    )
    ROUND_ATTEMPTS_EXHAUSTED = (
        "ROUND_ATTEMPTS_EXHAUSTED",
        "A round of the run failed or killed its worker more often than AIDAWORK_MAX_ROUND_ATTEMPTS allows.",
        False, 500, _EXIT_ERROR,
    )
    CONFIG_INVALID = (
        "CONFIG_INVALID", "The run's stored config is no longer valid for this worker (a tool or provider it names).",
        False, 500, _EXIT_ERROR,
    )
    ROUND_PROOF_INVALID = (
        "ROUND_PROOF_INVALID",
        "A stored round's proof does not verify: it was changed by someone without the server secret.",
        False, 500, _EXIT_ERROR,
    )
    RESUME_REFUSED = (
        "RESUME_REFUSED", "A resume does not match the run's stored suspension; nothing was changed.",
        False, 500, _EXIT_ERROR,
    )
    FENCE_LOST = (
        "FENCE_LOST", "Another claim of the run superseded this worker's; nothing was written.",
        False, 500, _EXIT_ERROR,
    )
    CANCELLED = ("CANCELLED", "The run was cancelled by request.", False, 500, _EXIT_ERROR)
    INTERRUPTED = (
        "INTERRUPTED",
        "A later run of the Root, submitted with root_policy interrupt, cancelled the run at its round boundary.",
        False, 500, _EXIT_ERROR,
    )
    ROLLED_BACK = (
        "ROLLED_BACK",
        "A later run of the Root, submitted with root_policy rollback, cancelled the run and dropped its messages.",
        False, 500, _EXIT_ERROR,
    )

    # --- a tool call's failed result (the model sees it; the run goes on) -----------------

    TOOL_FAILED = ("TOOL_FAILED", "The tool reported an expected failure.", False, 500, _EXIT_ERROR)
    TOOL_UNKNOWN = ("TOOL_UNKNOWN", "The model called a tool the run does not enable.", False, 500, _EXIT_ERROR)
    TOOL_ARGS_INVALID = (
        "TOOL_ARGS_INVALID", "The model's arguments do not match the tool's schema.", False, 500, _EXIT_ERROR,
    )
    TOOL_RESULT_INVALID = (
        "TOOL_RESULT_INVALID", "The tool's result cannot be stored as JSON.", False, 500, _EXIT_ERROR,
    )
    TOOL_ERROR = ("TOOL_ERROR", "The tool raised an unexpected exception.", False, 500, _EXIT_ERROR)
    TOOL_TIMEOUT = ("TOOL_TIMEOUT", "The tool did not finish within its timeout.", True, 503, _EXIT_ERROR)
    TOOL_REJECTED = ("TOOL_REJECTED", "A person rejected the tool call, with a reason.", False, 500, _EXIT_ERROR)
    MCP_SERVER_UNAVAILABLE = (
        "MCP_SERVER_UNAVAILABLE", "The tool's MCP server could not be reached, or its session broke during the call.",
        True, 503, _EXIT_ERROR,
    )
    MCP_TOOL_ERROR = (
        "MCP_TOOL_ERROR", "The tool's MCP server answered the call with an error.", False, 500, _EXIT_ERROR,
    )


class AidaworkError(Exception):
    """Base of every error this project raises on purpose. ``code`` is an ``ErrorCode``
    for every error of the project (a plugin's ``ToolFailed`` may name its own)."""

    code: str = ErrorCode.AIDAWORK_ERROR
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
