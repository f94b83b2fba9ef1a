"""The digest chain of a case: one link per round over everything the case says of it,
starting from a link over the run (input, config, prompt, tools, prior context). The last
link is the case's ``chain_digest``: a digest an operator can publish for a case, so that
someone without the deployment's key can check the case against it."""

from __future__ import annotations

from runtime.canonical import chain_digest
from schema.wire.case import CASE_FORMAT, Case, CaseRound


def run_link(case: Case) -> str:
    """The chain's start: the run and what every round was sent besides its messages."""
    header = {
        "format": CASE_FORMAT,
        "run": case.run.model_dump(mode="json"),
        "system": case.system,
        "tools": case.tools,
        "prior": case.prior.model_dump(mode="json"),
    }
    return chain_digest("", header)


def round_link(previous: str, round_: CaseRound) -> str:
    """``previous`` extended by the whole round as the case holds it (but its own link)."""
    return chain_digest(previous, round_.model_dump(mode="json", exclude={"link"}))


def links(case: Case) -> list[str]:
    """Every round's link, recomputed from the case."""
    current = run_link(case)
    found = []
    for round_ in case.rounds:
        current = round_link(current, round_)
        found.append(current)
    return found


def chain_of(case: Case) -> str:
    """The case's chain digest, recomputed: the last round's link."""
    found = links(case)
    return found[-1] if found else run_link(case)
