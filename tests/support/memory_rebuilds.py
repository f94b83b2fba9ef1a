"""The in-memory store's context rebuilds: the chain reservation, the candidate and the
admission (``schema.store.rebuilds``), with the core's rules passed in as the real store
takes them."""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID, uuid4

from schema.store.errors import FenceLost
from schema.store.rebuilds import PlanReservation, Reservation, VerifyPrefix
from schema.wire.rebuild import ChainBuild, RebuildCandidate, SourceMessage
from tests.support.memory_state import State


class RebuildOps(State):
    def reserve_model_rebuild(
        self,
        *,
        run_id: UUID,
        fence: int,
        boundary_seq: int,
        chain_anchor: int,
        predecessor_build_id: UUID | None,
        plan_reservation: PlanReservation,
    ) -> Reservation:
        with self._lock:
            self.calls.append("reserve_model_rebuild")
            root_id = self._held(run_id, fence).root_id
            chain = sorted(
                (
                    ChainBuild(str(i), b["ordinal"], i in self.consumptions)
                    for i, b in self.builds.items()
                    if (b["root_id"], b["chain_anchor"]) == (root_id, chain_anchor)
                ),
                key=lambda b: b.ordinal,
            )
            plan = plan_reservation(chain, str(predecessor_build_id) if predecessor_build_id else None)
            held = {"run_id": run_id, "claim_fence": fence, "boundary_seq": boundary_seq}
            if plan.take_build_id is not None:
                build_id = UUID(plan.take_build_id)
                self.builds[build_id].update(held, source_message_ids=None, source_digest=None, summary=None)
            else:
                assert plan.ordinal not in {b.ordinal for b in chain}, "one build per (root, chain, ordinal)"
                build_id = uuid4()
                self.builds[build_id] = {
                    **held,
                    "root_id": root_id,
                    "chain_anchor": chain_anchor,
                    "ordinal": plan.ordinal,
                    "predecessor_build_id": plan.predecessor_build_id,
                    "source_message_ids": None,
                    "source_digest": None,
                    "summary": None,
                }
            predecessor = UUID(plan.predecessor_build_id) if plan.predecessor_build_id else None
            return Reservation(build_id, plan.ordinal, predecessor)

    def _sources(self, root_id: UUID, from_position: int) -> list[SourceMessage]:
        rows = sorted((m for m in self.messages if m["root_id"] == root_id), key=lambda m: m["position"])
        return [
            SourceMessage(m["id"], m["position"], str(m["run_id"]), self._body(m["run_id"], m["body"]))
            for m in rows
            if m["position"] >= from_position
        ]

    def load_context_sources(self, root_id: UUID, from_position: int) -> list[SourceMessage]:
        with self._lock:
            self.calls.append("load_context_sources")
            return self._sources(root_id, from_position)

    def record_candidate(self, build_id: UUID, run_id: UUID, fence: int, candidate: RebuildCandidate) -> None:
        with self._lock:
            self.calls.append("record_candidate")
            build = self.builds.get(build_id)
            if build is None or (build["run_id"], build["claim_fence"]) != (run_id, fence):
                raise FenceLost(run_id, fence)
            build.update(
                source_message_ids=list(candidate.source_message_ids),
                source_digest=candidate.source_digest,
                summary=candidate.summary,
            )

    def admit_model_rebuild_request(
        self,
        *,
        build_id: UUID,
        run_id: UUID,
        fence: int,
        boundary_seq: int,
        chain_anchor: int,
        context_start: int,
        candidate: RebuildCandidate,
        authorize: Callable[[int], None],
        verify_prefix: VerifyPrefix,
        after_snapshot: Callable[[], None] | None = None,
    ) -> None:
        with self._lock:
            self.calls.append("admit_model_rebuild_request")
            run = self._held(run_id, fence)
            authorize(fence)
            eligible = {str(r.id) for r in self.runs.values() if r.root_id == run.root_id}
            eligible = {i for i in eligible if self.runs[UUID(i)].status == "completed" or UUID(i) == run_id}
            verify_prefix(candidate, self._sources(run.root_id, context_start), eligible)
            if after_snapshot is not None:
                after_snapshot()
            assert build_id not in self.consumptions, "a build is consumed once"
            self.consumptions[build_id] = {
                "run_id": run_id,
                "boundary_seq": boundary_seq,
                "claim_fence": fence,
                "source_digest": candidate.source_digest,
            }
            cp = self.checkpoints[run_id]
            cp.boundary_seq, cp.context_start_position = boundary_seq, candidate.last_source_position + 1
            cp.summary, cp.rebuilds, cp.last_build_id, cp.chain_anchor = (
                candidate.summary,
                cp.rebuilds + 1,
                build_id,
                chain_anchor,
            )
            run.event_seq += 1
            event = {
                "build_id": str(build_id),
                "boundary_seq": boundary_seq,
                "source_messages": len(candidate.source_message_ids),
                "context_start": candidate.last_source_position + 1,
            }
            self._event(run_id, run.event_seq, "context_rebuilt", event)
