#!/usr/bin/env bash
# The PostgreSQL burn-down of no-op jobs, tickler against graphile-worker,
# on one server in one run: each round runs tickler's (`--only pg_burn`:
# the raw 32-per-transaction SKIP LOCKED loop, then tickler's 4-thread
# pool with default settings) and then graphile-worker's
# (graphile-worker/burn.mjs, 4 concurrent jobs with its batching settings,
# once as filled and once with the jobs table analyzed after the fill), so
# that a change in the machine's load shows in all of them. One JSON line
# per figure on stdout.
#
#   .ci/postgres benches/peers/compare-pg.sh [--quick] [ROUNDS]
#
# --quick: 20,000 jobs instead of 200,000. ROUNDS: 3 unless given.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
quick=()
jobs=200000
if [[ ${1:-} == --quick ]]; then
    quick=(--quick)
    jobs=20000
    shift
fi
rounds=${1:-3}
: "${TICKLER_BENCH_DATABASE_URL:?run it under .ci/postgres (or set TICKLER_BENCH_DATABASE_URL)}"
cargo bench --features postgres --bench tickler_bench --no-run >&2
for ((round = 1; round <= rounds; round++)); do
    echo "# round $round of $rounds" >&2
    cargo bench -q --features postgres --bench tickler_bench -- --only pg_burn "${quick[@]}"
    benches/peers/graphile-worker/run.sh "$jobs" --config c4_batched
    benches/peers/graphile-worker/run.sh "$jobs" --config c4_batched --analyze
done
