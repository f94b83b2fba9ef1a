"""Golden transcripts: a fixed run whose digests and proofs are pinned as literal hex.

Stored rounds carry digests (of the system prompt, the messages, the tool set, the accepted
response; a chain digest per message; a digest of each tool call's args and result) and
HMAC proofs over projections of them. A proof written yesterday must verify today, so any
change to what these are computed from (a key renamed in ``Message.to_json``, a field added
to a projection, canonical JSON spacing or key order) invalidates every stored run, while
tests that compare one run with another stay green. These tests fail instead.

If one fails after a deliberate change of serialisation, the change needs a migration of
stored digests and proofs (or a versioned format), not new literals.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from uuid import UUID

from runtime.canonical import chain_digest, digest
from runtime.deps import build_runtime
from runtime.loop import drive_react_loop
from runtime.outcomes import RoundResult
from runtime.prepare import prepare_execution
from runtime.proofs import ProofAuthority
from runtime.state import RunState

SECRET = b"golden-transcript-secret-0123456789"
RUN_ID = UUID("00000000-0000-4000-8000-00000000a1da")
OWNER = "team-golden"
FENCE_ROUND_0, FENCE_ROUND_1 = 7, 8  # round 1 runs under the next claim

ADD_THEN_ANSWER: dict[str, Any] = {
    "owner": OWNER,
    "root_id": None,
    "input": "Add 2 and 3.",
    "config": {
        "model": {
            "provider": "scripted",
            "turns": [
                {"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]},
                {"content": "The sum is 5."},
            ],
        },
        "system_prompt": "You add numbers.",
        "tools": ["add"],
        "policy": {"max_rounds": 5},
    },
}

READ_AND_SUSPEND: dict[str, Any] = {
    **ADD_THEN_ANSWER,
    "input": "Read the notes.",
    "config": {
        **ADD_THEN_ANSWER["config"],
        "model": {
            "provider": "scripted",
            "turns": [{"tool_calls": [{"name": "read_files", "args": {"paths": ["notes/a.txt"]}}]}, {"content": "ok"}],
        },
        "system_prompt": "You read files.",
        "tools": ["read_files"],
    },
}


def rounds_of(raw: dict[str, Any], fences: tuple[int, ...]) -> list[RoundResult]:
    """Drive the run one round per fence, each round under its own claim."""
    _, prepared = prepare_execution(build_runtime(secret=SECRET), raw)
    state = RunState(input=raw["input"], run_id=RUN_ID, claim_fence=fences[0], work_owner=OWNER)
    results = []
    for fence in fences:
        state = dataclasses.replace(state, claim_fence=fence)
        results.append(drive_react_loop(prepared.deps, state))
        state = state.after(results[-1])
    return results


def pinned(result: RoundResult) -> dict[str, Any]:
    """Everything of a round that is stored and later recomputed or verified."""
    assert result.projection is not None
    return {
        "system": result.digests.system,
        "messages": result.digests.messages,
        "tools": result.digests.tools,
        "accepted_response": result.digests.accepted_response,
        "chain": [m.chain_digest for m in result.new_messages],
        "tool_calls": [
            {"args": i.args_digest, "result": i.result_digest, "projection": i.projection and i.projection.proof}
            for i in result.tool_invocations
        ],
        "round_proof": result.projection.proof,
    }


# Computed once from the code at d4fdd4f. Never regenerate them to make a failing test pass.
GOLDEN_ADD_THEN_ANSWER: list[dict[str, Any]] = [
    {
        "system": "f0f30e4ec2b7c09bf555b18060c30b64b2fba9c22abd70c4b07941629640de10",
        "messages": "45bde726da20fc00b887ec1da9c7df5a3ea2e4a7472c44a273a834df9264eca7",
        "tools": "e6f508712b338a0c59ba01bc5dcc4b1483c45174bdd5e5b9eb472ef803bfcf59",
        "accepted_response": "8f5bd85fc1caea9073f2bc37c2cb803df14384ab35533d89c62a9a5015ceeb4a",
        "chain": [
            "45bde726da20fc00b887ec1da9c7df5a3ea2e4a7472c44a273a834df9264eca7",
            "a0b06de25d33ece58cea262dd22286e053eeb08b6e1414b1d11bebc41dd363da",
            "1b1b6183bbe0c1205c1d8fe131e3e9477e7d30eb6bb1bb056869f0478f75acaf",
        ],
        "tool_calls": [
            {
                "args": "206f7b5543e6f2ef39bf334988fd7097b725caeed16588cd9d785480f2f0f8f6",
                "result": "4403134882233d347dfa35d23b98c42a4442478ce521631ef566d21df77e2a52",
                "projection": None,
            }
        ],
        "round_proof": "8a529c220b6583528aeb2c8fa5e51ae45c4929c24964e6b132315002f255126e",
    },
    {
        "system": "f0f30e4ec2b7c09bf555b18060c30b64b2fba9c22abd70c4b07941629640de10",
        "messages": "1b1b6183bbe0c1205c1d8fe131e3e9477e7d30eb6bb1bb056869f0478f75acaf",
        "tools": "e6f508712b338a0c59ba01bc5dcc4b1483c45174bdd5e5b9eb472ef803bfcf59",
        "accepted_response": "ec21b66425ddd185c6e861086805faa8b2ab5861a7a72519d23427997a32fbe7",
        "chain": ["870b8ef16f751af704c37debf48b647bb96cbd486e72703322fc1d38a762ae68"],
        "tool_calls": [],
        "round_proof": "5f02931112c4599bd18fbc497355e47afa8e47a35e7c694c1e6a47d1472cd257",
    },
]

GOLDEN_READ_AND_SUSPEND: dict[str, Any] = {
    "system": "46bd5492d52a001de78ee51472004d3ee0c52283ae7f242ebc2399f09ea70165",
    "messages": "0a1e06b212033c83640089d6e4bc8b3740dc8829f2357c7174e0237fb79a1432",
    "tools": "d3641f0896c7ea6b678f2412934aeec10c7db316465196e7b7bf4f49c00ec7a9",
    "accepted_response": "6bc5ef147dcdf09d2188b17fbedc71326d095da4688df0dd7a6f326abb2556dd",
    "chain": [
        "0a1e06b212033c83640089d6e4bc8b3740dc8829f2357c7174e0237fb79a1432",
        "45bde24c46871183105c3386a3906980d0a5598c383bc5b99b3204082e8346ec",
    ],
    "tool_calls": [
        {
            "args": "175ccb9688c3da7fbd3aa00ffaf1e3cb5bb63d3c2b4508db97a217d8df050324",
            "result": None,
            "projection": "f8434ee5cb78f6d98c28493bb31fbbf827a0c1da00a31578cca9f7073db03d90",
        }
    ],
    "round_proof": "6e95430b742bc08aa93add890fae7da2e2dd455808abf04d24132bcae0aa00f7",
    "tool_call_fields": {
        "run_id": "00000000-0000-4000-8000-00000000a1da",
        "boundary_seq": 0,
        "claim_fence": 7,
        "tool_call_id": "call_0_0",
        "tool_domain": "local",
        "args_digest": "175ccb9688c3da7fbd3aa00ffaf1e3cb5bb63d3c2b4508db97a217d8df050324",
        "invocation_id": "a05a932ec83a674546bbf0b6bf385009",
        "work_owner": "team-golden",
        "round_proof": "6e95430b742bc08aa93add890fae7da2e2dd455808abf04d24132bcae0aa00f7",
    },
}

GOLDEN_SIGNATURE = "afd5607d1760a12ff3abd217f07e996fd6444e87b0e18597bb5da7122260179c"


def test_the_add_then_answer_transcript_has_its_pinned_digests_and_proofs() -> None:
    assert [pinned(r) for r in rounds_of(ADD_THEN_ANSWER, (FENCE_ROUND_0, FENCE_ROUND_1))] == GOLDEN_ADD_THEN_ANSWER


def test_a_suspended_call_has_its_pinned_tool_call_projection_and_proof() -> None:
    (result,) = rounds_of(READ_AND_SUSPEND, (FENCE_ROUND_0,))
    (invocation,) = result.tool_invocations
    assert invocation.status == "suspended" and invocation.projection is not None
    projection = invocation.projection
    assert {**pinned(result), "tool_call_fields": projection.fields()} == GOLDEN_READ_AND_SUSPEND


def test_the_pinned_chain_is_the_chain_of_the_message_bodies() -> None:
    """The chain digests are recomputed from each message's stored JSON body, so the
    pinned literals above pin ``Message.to_json`` too."""
    results = rounds_of(ADD_THEN_ANSWER, (FENCE_ROUND_0, FENCE_ROUND_1))
    current = ""
    for m in [m for r in results for m in r.new_messages]:
        current = chain_digest(current, m.message.to_json())
        assert m.chain_digest == current
    assert results[0].digests.system == digest("You add numbers.")


def test_the_proof_of_fixed_fields_under_a_fixed_secret_is_pinned() -> None:
    """The HMAC itself (kind, canonical JSON of the fields, SHA-256), apart from the loop."""
    authority = ProofAuthority(SECRET)
    fields = {"run_id": str(RUN_ID), "boundary_seq": 0, "claim_fence": FENCE_ROUND_0}
    assert authority.sign("round", fields) == GOLDEN_SIGNATURE


# A client tool's wait: its proof covers the wait (suspension_digest). Computed once from
# the code at cc67f36.
ASK: dict[str, Any] = {
    **ADD_THEN_ANSWER,
    "input": "Ask me.",
    "config": {
        **ADD_THEN_ANSWER["config"],
        "model": {
            "provider": "scripted",
            "turns": [{"tool_calls": [{"name": "ask", "args": {"q": "why?"}}]}, {"content": "ok"}],
        },
        "tools": [],
        "client_tools": [{"name": "ask", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}],
    },
}
GOLDEN_ASK: dict[str, Any] = {"system": "f0f30e4ec2b7c09bf555b18060c30b64b2fba9c22abd70c4b07941629640de10",
 "messages": "78ae11d9781e9660697cdf104093644241c2c769e12d118dcf7cb170eb54744f",
 "tools": "89882a996840aca005b5f8539320107dcda21261051f5afd9526dc37d3703e42",
 "accepted_response": "9b08b2b07e29be890366dea9c2b65d46e0f36d4a7d57be20526a9bae053ed9ef",
 "chain": ["78ae11d9781e9660697cdf104093644241c2c769e12d118dcf7cb170eb54744f",
           "51890a117df682b5efa1f1602f1ea3258aa4cb08098931756e65b83948d5a47c"],
 "tool_calls": [{"args": "4ea84a788ce2b663109707295fc18eb6778eac1858414c51bd1d81290a261b00",
                 "result": None,
                 "projection": "f8318cad4528323657dc53f93e3045687984d443edb606683195000278b5f576"}],
 "round_proof": "80991d9365da351aef26e2b48ac7a9fba19fb62a2c5c723d88d6e2374dfc86d0",
 "tool_call_fields": {"run_id": "00000000-0000-4000-8000-00000000a1da",
                      "boundary_seq": 0,
                      "claim_fence": 7,
                      "tool_call_id": "call_0_0",
                      "tool_domain": "local",
                      "args_digest": "4ea84a788ce2b663109707295fc18eb6778eac1858414c51bd1d81290a261b00",
                      "invocation_id": "a05a932ec83a674546bbf0b6bf385009",
                      "work_owner": "team-golden",
                      "round_proof": "80991d9365da351aef26e2b48ac7a9fba19fb62a2c5c723d88d6e2374dfc86d0",
                      "suspension_digest": "a1ee7c540d07a0c237c07d67d16bf43d74d99502e7b7dd2e1730459e742ebe8f"}}


def test_a_client_tool_wait_has_its_pinned_tool_call_projection_and_proof() -> None:
    (result,) = rounds_of(ASK, (FENCE_ROUND_0,))
    (ask,) = result.tool_invocations
    assert ask.status == "suspended" and ask.projection is not None
    assert {**pinned(result), "tool_call_fields": ask.projection.fields()} == GOLDEN_ASK
