"""A replay as a command runs it: read the case file, verify it with the deployment's key
(``AIDAWORK_SECRET_KEY``; the development secret under ``AIDAWORK_DEV``) and a published
chain digest if one is given, then replay it in this process (``runtime.cases.replay``)
with its own config or another. Nothing is written: no database, no broker."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import structlog

from runtime.cases.replay import Mode, replay_case
from runtime.cases.report import ReplayReport, RoundReport, RoundStatus
from runtime.cases.verify import CaseInvalid, Verified, parse_case, verify_case
from runtime.deps import DEV_SECRET, Runtime
from runtime.errors import RequestInvalid
from runtime.proofs import ProofAuthority
from schema.wire.case import Case
from worker.ops.settings import Settings

log = structlog.get_logger("aidawork.replay")


def deployment_proofs(settings: Settings) -> ProofAuthority | None:
    """What checks the cases' proofs here: the deployment's key (the development one under
    AIDAWORK_DEV); None when neither is set, and the proofs then go unchecked."""
    if settings.secret_key is not None:
        return ProofAuthority(settings.secret_key.get_secret_value().encode())
    return ProofAuthority(DEV_SECRET) if settings.dev else None


def read_case(path: str | Path) -> Case:
    """The case in the file, or ``CaseInvalid`` saying why it cannot be read."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise CaseInvalid(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CaseInvalid(f"{path} is not UTF-8 text") from None
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise CaseInvalid(f"{path} is not valid JSON: {exc}") from None
    return parse_case(raw)


def load_verified(path: str | Path, settings: Settings, *, published: str | None = None) -> tuple[Case, Verified]:
    """The case, verified; ``CaseTampered`` naming the round otherwise."""
    case = read_case(path)
    verified = verify_case(case, proofs=deployment_proofs(settings), published=published)
    log.info("case_verified", run_id=str(case.run.run_id), rounds=len(case.rounds),
             proofs_checked=verified.proofs_checked, chain_digest=verified.chain_digest)
    return case, verified


def replay_verified(
    case: Case,
    verified: Verified,
    runtime: Runtime,
    *,
    config: Mapping[str, object] | None = None,
    model: Mode = "recorded",
    tools: Mode = "live",
) -> ReplayReport:
    """Replay a verified case with ``config`` (None: the run's own). A config given that
    does not validate here raises ``RequestInvalid``; the run's own config failing to
    validate is the replay's finding (this code no longer runs it), reported at round 0."""
    try:
        report = replay_case(case, runtime, case.run.config if config is None else config, model=model, tools=tools,
                             chain_digest=verified.chain_digest, proofs_checked=verified.proofs_checked)
    except RequestInvalid as exc:
        if config is not None:
            raise
        drift = f"the run's config does not validate here: {exc.message}"
        missing = [RoundReport(r.boundary_seq, RoundStatus.MISSING, notes=("not replayed",)) for r in case.rounds[1:]]
        rounds = (RoundReport(0, RoundStatus.DIFFERS, ("config",), drift=drift), *missing)
        report = ReplayReport(str(case.run.run_id), model, tools, verified.chain_digest, verified.proofs_checked,
                              rounds)
    log.info("case_replayed", run_id=report.run_id, ok=report.ok, model=model, tools=tools,
             differs=[r.boundary_seq for r in report.rounds if r.status != RoundStatus.SAME])
    return report
