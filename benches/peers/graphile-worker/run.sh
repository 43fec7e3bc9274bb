#!/usr/bin/env bash
# graphile-worker's burn-down of no-op jobs (see README.md): installs the
# pinned packages (npm ci) when node_modules is missing, then runs burn.mjs
# with the arguments given, e.g. `./run.sh 20000 --config c4_batched`.
# Needs TICKLER_BENCH_DATABASE_URL (or TICKLER_TEST_DATABASE_URL), as
# `source .ci/postgres` exports.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

for tool in node npm; do
    if ! command -v "$tool" >/dev/null; then
        echo "run.sh: '$tool' not found; the graphile-worker peer benchmark needs Node.js 20 or newer and npm" >&2
        exit 1
    fi
done
major=$(node -p 'process.versions.node.split(".")[0]')
if [[ $major -lt 20 ]]; then
    echo "run.sh: Node.js $(node --version) is too old; the graphile-worker peer benchmark needs 20 or newer" >&2
    exit 1
fi

if [[ ! -d node_modules/graphile-worker ]]; then
    echo "run.sh: installing graphile-worker (npm ci)" >&2
    npm ci --no-audit --no-fund >&2
fi

exec node burn.mjs "$@"
