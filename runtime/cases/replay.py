"""Replaying a verified case in this process, with the runtime's own round
(``runtime.loop.drive_react_loop``) and no store: each recorded round is run again with
the deps a NEW config composes here (``runtime.prepare.prepare_turn``: this code's tools,
their schemas, the prompt), so a changed prompt, tool set or schema shows as a differing
digest or a refused call, and the result is compared with the record
(``runtime.cases.report.compare_round``).

- ``model="recorded"``: the model's answers are the recorded ones (round ``i`` answers
  with round ``i``'s accepted response); ``model="live"``: the config's provider is called.
- ``tools="live"``: tool calls run for real; ``tools="recorded"``: a call is served from the
  record when the record has one of that tool with the same args digest (in that round,
  else any), and otherwise refused: the replay stops there, failing closed.
- Calls answered from outside the worker (an approval or rejection, a client tool's result,
  delivered files) are always served from the record: nobody is there to answer again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Literal

from runtime.canonical import digest
from runtime.cases.report import ReplayReport, RoundReport, RoundStatus, compare_round
from runtime.context import context_chain
from runtime.deps import BaseDeps, OrchestratorDeps, Runtime
from runtime.errors import ModelError, ModelScriptExhausted
from runtime.loop import drive_react_loop
from runtime.messages import Message, ToolCall
from runtime.models.base import ModelClient, ModelRequest, ModelResponse
from runtime.outcomes import Continue
from runtime.prepare import prepare_turn
from runtime.state import RunState
from runtime.tools import Tool, ToolContext, ToolOutcome
from runtime.tools.base import ToolArgs
from schema.wire.case import Case, CaseToolCall
from schema.wire.errors import ErrorCode
from schema.wire.json import JsonMapping, JsonObject
from schema.wire.vocab import ToolStatus

Mode = Literal["recorded", "live"]


class CallNotRecorded(Exception):
    """A tool call the record cannot serve, with ``tools="recorded"``: the round stops."""

    def __init__(self, boundary_seq: int, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.boundary_seq = boundary_seq


class RecordedModel:
    """Round ``i``'s recorded answer, for round ``i`` (its error, if it had none)."""

    def __init__(self, case: Case) -> None:
        self._rounds = case.rounds

    def complete(self, request: ModelRequest) -> ModelResponse:
        index = request.round_index
        if not 0 <= index < len(self._rounds):
            raise ModelScriptExhausted(f"the case has {len(self._rounds)} rounds and round {index} was asked for")
        recorded = self._rounds[index]
        if recorded.response is None:
            error = ModelError(f"round {index} ended without a response on record ({recorded.error_code})")
            error.code = ErrorCode.lookup(recorded.error_code or "") or ErrorCode.MODEL_ERROR
            raise error
        return ModelResponse.from_json(recorded.response)


@dataclass
class RecordBook:
    """The case's tool calls, and the calls the model asked for in the current round."""

    case: Case
    tools: Mode
    asked: dict[str, ToolCall] = field(default_factory=dict)
    served: list[str] = field(default_factory=list)

    def find(self, boundary_seq: int, call: ToolCall) -> CaseToolCall | None:
        args_digest = digest(call.args)
        rounds = sorted(self.case.rounds, key=lambda r: r.boundary_seq != boundary_seq)
        for round_ in rounds:
            for recorded in round_.tool_calls:
                if recorded.tool_name == call.name and recorded.args_digest == args_digest:
                    return recorded
        return None

    def outcome(self, tool: Tool, args: ToolArgs, ctx: ToolContext) -> ToolOutcome:
        # A call id the provider reused is renamed ``<id>_<round>_<index>`` by the loop.
        call = self.asked.get(ctx.tool_call_id) or next(
            (c for c in self.asked.values() if ctx.tool_call_id.startswith(f"{c.id}_")), None
        )
        recorded = None if call is None else self.find(ctx.boundary_seq, call)
        if recorded is not None and recorded.status == ToolStatus.SUSPENDED:
            recorded = None  # it never completed: there is nothing to serve
        answered = recorded is not None and (recorded.answered or recorded.approval is not None)
        if recorded is not None and (self.tools == "recorded" or answered):
            self.served.append(ctx.tool_call_id)
            context = recorded.result if recorded.context is None else recorded.context
            return ToolOutcome(ToolStatus(recorded.status), recorded.result, context)
        if self.tools == "live":
            return tool.run(args, ctx)
        raise CallNotRecorded(ctx.boundary_seq, tool.name, "no recorded call of this tool has these args "
                              "(--tools live runs such calls for real)")


@dataclass(frozen=True)
class ReplayedTool(Tool):
    """The config's tool (its spec and schema, so its args are checked as usual), run
    through the record book."""

    book: RecordBook | None = None
    original: Tool | None = None

    def run(self, args: ToolArgs, ctx: ToolContext) -> ToolOutcome:
        assert self.book is not None and self.original is not None
        return self.book.outcome(self.original, args, ctx)


def replayed(tool: Tool, book: RecordBook) -> Tool:
    return ReplayedTool(**{f.name: getattr(tool, f.name) for f in fields(Tool)}, book=book, original=tool)


class ListeningModel:
    """The model, telling the book which calls it asked for (the args as asked: a tool's
    handler sees them parsed)."""

    def __init__(self, model: ModelClient, book: RecordBook) -> None:
        self._model, self._book = model, book

    def complete(self, request: ModelRequest) -> ModelResponse:
        response = self._model.complete(request)
        self._book.asked = {c.id: c for c in response.tool_calls}
        return response


def _for_recorded_model(runtime: Runtime, config: JsonMapping, model: ModelClient) -> tuple[Runtime, JsonObject]:
    """The runtime and config to prepare with when the record answers: the config's
    provider makes no client (no key is needed), and a scripted model's turns (which the
    record replaces) are not checked against the tools: each call is, in its round."""
    changed = dict(config)
    provider = ""
    if isinstance(changed.get("model"), dict):
        model_config = dict(changed["model"])  # type: ignore[arg-type]
        provider = str(model_config.get("provider", ""))
        if provider == "scripted":
            model_config["turns"] = [{"content": "(answered from the record)"}]
        changed["model"] = model_config
    providers = {**runtime.base.model_providers, provider: lambda _config, _owner: model}
    base: BaseDeps = replace(runtime.base, model_providers=providers)
    return replace(runtime, base=base), changed


def prepare_replay(
    runtime: Runtime, config: Mapping[str, object], owner: str, model: ModelClient | None
) -> OrchestratorDeps:
    """The deps ``config`` composes here (``RequestInvalid`` if it does not validate); with
    ``model``, that model answers in place of the config's provider."""
    raw: JsonObject = dict(config)  # type: ignore[arg-type]
    if model is not None:
        runtime, raw = _for_recorded_model(runtime, raw, model)
    return prepare_turn(runtime, raw, owner).deps


def initial_state(case: Case) -> RunState:
    prior = tuple(Message.from_json(body) for body in case.prior.messages)
    return RunState(
        input=case.run.input,
        history=prior,
        history_digest=context_chain(prior),
        last_position=case.prior.first_position - 1,
        run_id=case.run.run_id,
        work_owner="replay",
    )


def replay_case(
    case: Case,
    runtime: Runtime,
    config: Mapping[str, object],
    *,
    model: Mode = "recorded",
    tools: Mode = "live",
    chain_digest: str = "",
    proofs_checked: bool = False,
) -> ReplayReport:
    """Replay ``case`` (verified by the caller) with ``config``; ``RequestInvalid`` if the
    config does not validate here (nothing was replayed)."""
    book = RecordBook(case, tools)
    deps = prepare_replay(runtime, config, case.run.owner, RecordedModel(case) if model == "recorded" else None)
    deps = replace(
        deps,
        model=ListeningModel(deps.model, book),
        tools={name: replayed(tool, book) for name, tool in deps.tools.items()},
        # An approval on record is served with its call; a new call is not waited on.
        policy=deps.policy.model_copy(update={"require_approval": []}),
    )
    reports = _rounds(case, deps, book, model)
    reports += [RoundReport(r.boundary_seq, RoundStatus.MISSING, notes=("not replayed",))
                for r in case.rounds[len(reports):]]
    return ReplayReport(str(case.run.run_id), model, tools, chain_digest, proofs_checked, tuple(reports))


def _rounds(case: Case, deps: OrchestratorDeps, book: RecordBook, model: Mode) -> list[RoundReport]:
    state = initial_state(case)
    reports: list[RoundReport] = []
    while True:
        seq = state.boundary_seq
        recorded = case.rounds[seq] if seq < len(case.rounds) else None
        if recorded is None and model == "recorded":
            return reports  # the record ends here (a run that had not ended when exported)
        state = replace(state, claim_fence=recorded.claim_fence if recorded else 0)
        try:
            result = drive_react_loop(deps, state)
        except CallNotRecorded as exc:
            reports.append(RoundReport(seq, RoundStatus.DIFFERS, ("args",), (str(exc),), drift=str(exc)))
            return reports
        report = compare_round(result, recorded)
        reports.append(report)
        if report.drift is not None or not isinstance(result.outcome, Continue):
            return reports
        state = state.after(result)
