"""make bench-peers: AIDAWORK's zero-latency round wall time beside the peers' (issue 33's
target: a round <= 0.7x LangGraph with PostgresSaver and <= 0.7x DBOS's 2 durable steps,
at 10 and at 500 rounds), measured one after another on this machine:

1. the peers' harness (``../shared/peers-bench``, its own virtualenv ``.peers``), each script
   run alone with ``--json`` into OUT and its console output printed and kept in OUT/NAME.txt:
   - ``a_celery.py --modes durable --tests hop``: a plain Celery hop, for reference;
   - ``c_langgraph.py --ns 10,500``: a ReAct loop (model node + ToolNode); the figure compared
     is ``pg-sync`` (PostgresSaver, durability "sync": persisted before the next step), with
     ``pg-sync-delta`` (its beta delta channel) shown too;
   - ``d_dbos.py --ns 10,500``: a workflow of N durable steps; a round is 2 steps (model,
     tool), so its round is 2 x its ms per step;
2. AIDAWORK on the worker ``make bench`` measures rounds on (bench/rounds.py:
   ``aidawork worker --concurrency 8``, scripted model at zero latency, warmed by a 5-round
   run), its own bench database: for N = 10 (median of 5 runs, one after another) and N = 500
   (median of 3, as the harness takes 3 reps at N >= 500), a run of N rounds that each call a
   tool, then the final answer, which is what c_langgraph.py's N means; ms per round = (the
   run's finished_at - its created_at, i.e. from the submit) / N;
3. the ratios, each beside its target, into the console and OUT/summary.txt.

Usage:  python bench/peers.py --out DIR [--skip-harness] [--peers-bench DIR] [--peers-python PY]
``--skip-harness`` reads the harness's JSON already in DIR and measures only AIDAWORK.
The harness's database (``PEERBENCH_PG_DSN``, default database ``peerbench``) is created if
missing. Prints figures; never fails on timing (exits 1 only if a harness script failed or no
AIDAWORK run of some N completed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Our own database, so a `make bench` database is left as it is.
os.environ.setdefault("AIDAWORK_BENCH_DB", "aidawork_bench_peers")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench.env  # sets the environment before any project module reads it
from bench import db
from bench.procs import stop
from bench.rounds import ROUND_WORKER_CONCURRENCY, per_round_ms, round_worker

NS = (10, 500)
REPS = {10: 5, 500: 3}
TARGET = 0.7
PEER_DSN = os.environ.get("PEERBENCH_PG_DSN", "postgresql://postgres:postgres@127.0.0.1:5432/peerbench")
NS_ARG = ",".join(str(n) for n in NS)
SCRIPTS = {
    "a_celery": ["--modes", "durable", "--tests", "hop"],
    "c_langgraph": ["--ns", NS_ARG],
    "d_dbos": ["--ns", NS_ARG],
}


def log(message: str) -> None:
    print(f"[bench-peers] {message}", file=sys.stderr, flush=True)


def ensure_peer_database(dsn: str) -> None:
    """CREATE DATABASE for the harness's DSN if it does not exist (DBOS creates its own)."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = str(conninfo_to_dict(dsn)["dbname"])
    with psycopg.connect(make_conninfo(dsn, dbname="postgres"), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            log(f"created database {name}")


def run_harness(harness: Path, python: str, out: Path) -> list[str]:
    """Each script alone, its output printed as it comes and kept in OUT/NAME.txt."""
    failures = []
    for name, args in SCRIPTS.items():
        cmd = [python, f"{name}.py", *args, "--json", str(out / f"{name}.json")]
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"### {name} {time.strftime('%H:%M:%S')} load {' '.join(load)}: {' '.join(cmd[1:])}", flush=True)
        started = time.monotonic()
        with (out / f"{name}.txt").open("w") as kept:
            proc = subprocess.Popen(cmd, cwd=harness, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                kept.write(line)
            code = proc.wait()
        print(f"### {name} took {time.monotonic() - started:.0f} s, exit {code}", flush=True)
        if code:
            failures.append(f"{name}.py exited {code} (see {out / name}.txt)")
    return failures


def measure_aidawork() -> tuple[dict[int, list[float]], list[str]]:
    """ms per round of each run, by N; and notes on runs that did not complete."""
    db.reset()
    samples: dict[int, list[float]] = {n: [] for n in NS}
    worker, stuck = round_worker()
    notes = [f"warm-up {db.describe_stuck(i)}" for i in stuck]
    try:
        for n in NS:
            for _ in range(REPS[n]):
                run_id = db.submit(db.scripted(n + 1))  # n tool rounds, then the answer
                if db.wait_finished([run_id], poll_s=0.02):
                    notes.append(db.describe_stuck(run_id))
                elif (row := db.run_row(run_id)).status != "completed":
                    notes.append(f"run {run_id} ended {row.status} ({row.error_code})")
                else:
                    samples[n].append(per_round_ms(run_id, n, since="created_at"))
    finally:
        stop(worker)
    return samples, notes


def _load(out: Path, name: str) -> list[dict[str, Any]]:
    path = out / f"{name}.json"
    return json.loads(path.read_text())["results"] if path.is_file() else []


def _pick(results: list[dict[str, Any]], n: int, **match: str) -> dict[str, Any] | None:
    for row in results:
        if row.get("n") == n and all(row.get(k) == v for k, v in match.items()):
            return row
    return None


def _spread(stat: dict[str, Any], scale: float = 1.0) -> str:
    return f"{stat['median'] * scale:7.2f} ms ({stat['min'] * scale:.2f}-{stat['max'] * scale:.2f})"


def report(samples: dict[int, list[float]], out: Path) -> list[str]:
    langgraph, dbos, celery = _load(out, "c_langgraph"), _load(out, "d_dbos"), _load(out, "a_celery")
    lines = [
        "Zero-latency round wall time, AIDAWORK beside its peers (issue 33: each ratio <= 0.7), median (min-max)",
        f"  AIDAWORK: `aidawork worker --concurrency {ROUND_WORKER_CONCURRENCY}`, scripted model; a run of N tool "
        "rounds + the final answer,",
        "    (finished_at - created_at) / N, i.e. from the submit, the Celery hops included; "
        + ", ".join(f"{REPS[n]} runs at N={n}" for n in NS),
        "  LangGraph: N model+tool rounds + the final answer, one process, wall / N; "
        "DBOS: a round = 2 x its ms per step",
        "",
    ]
    for n in NS:
        ours = samples[n]
        if not ours:
            lines += [f"N={n}: no AIDAWORK run completed", ""]
            continue
        mine = statistics.median(ours)
        lines.append(f"N={n:<4} {'AIDAWORK ms/round':<41} {mine:7.2f} ms ({min(ours):.2f}-{max(ours):.2f})")
        peers: list[tuple[str, dict[str, Any] | None, float, bool]] = [
            ("LangGraph PostgresSaver pg-sync", _pick(langgraph, n, variant="pg-sync"), 1.0, True),
            ("LangGraph pg-sync-delta (beta, shown)", _pick(langgraph, n, variant="pg-sync-delta"), 1.0, False),
            ("DBOS, 2 steps (2 x ms/step)", _pick(dbos, n, variant="step"), 2.0, True),
        ]
        for label, row, scale, target in peers:
            if row is None:
                lines.append(f"       vs {label:<38} missing (no figure in {out})")
                continue
            stat = row["per_round_ms"] if "per_round_ms" in row else row["per_step_ms"]
            ratio = mine / (stat["median"] * scale)
            verdict = f"target <= {TARGET}: " + ("met" if ratio <= TARGET else "NOT met") if target else "(no target)"
            lines.append(f"       vs {label:<38} {_spread(stat, scale)}   ratio {ratio:4.2f}  {verdict}")
        lines.append("")
    hops = [row for row in celery if "hop" in row]
    for row in hops:
        p50, cycle = row["hop"]["hop_p50_us"]["median"] / 1000, row["hop"]["cycle_us"]["median"] / 1000
        ratios = ", ".join(f"N={n} {statistics.median(samples[n]) / cycle:.2f}x" for n in NS if samples[n])
        lines.append(
            f"Plain Celery hop ({row['mode']}, {row['pool']} pool): p50 {p50:.2f} ms, cycle {cycle:.2f} ms "
            f"per hop; an AIDAWORK round = {ratios} the cycle"
        )
    return lines


def main() -> int:
    repo = Path(bench.env.REPO)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", required=True, type=Path, help="directory for the harness's JSON and console output")
    ap.add_argument("--skip-harness", action="store_true", help="reuse the harness's JSON already in --out")
    ap.add_argument("--peers-bench", type=Path, default=repo / ".." / "shared" / "peers-bench")
    ap.add_argument("--peers-python", default=str(repo / ".peers" / "bin" / "python"))
    args = ap.parse_args()
    started = time.monotonic()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    if not args.skip_harness:
        harness = args.peers_bench.resolve()
        if not (harness / "c_langgraph.py").is_file():
            print(f"bench-peers: no peers' harness at {harness} (set PEERS_BENCH / --peers-bench)", file=sys.stderr)
            return 2
        if not Path(args.peers_python).is_file():
            print(f"bench-peers: no Python at {args.peers_python} (make bench-peers creates .peers)", file=sys.stderr)
            return 2
        ensure_peer_database(PEER_DSN)
        log(f"the peers' harness, one script after another, into {out}")
        # absolute, not resolved: the scripts run in the harness's folder, and the venv's python is a symlink
        failures += run_harness(harness, os.path.abspath(args.peers_python), out)
    log("AIDAWORK: " + ", ".join(f"{REPS[n]} runs of N={n}" for n in NS))
    samples, notes = measure_aidawork()
    (out / "aidawork.json").write_text(json.dumps({"per_round_ms": {str(n): v for n, v in samples.items()}}))
    lines = ["", *report(samples, out)]
    lines += [f"NOTE: {note}" for note in [*notes, *failures]]
    lines += [f"(bench-peers took {time.monotonic() - started:.0f} s; raw output in {out})"]
    print("\n".join(lines), flush=True)
    (out / "summary.txt").write_text("\n".join(lines[1:]) + "\n")
    return 1 if failures or not all(samples.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
