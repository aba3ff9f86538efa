#!/usr/bin/env bash
# make chaos: a scripted fault run against real services. It submits tasks from several
# tenants, then FLUSHDBs Redis, kill -9s the server and restarts it, and restarts
# Postgres, and reports whether every accepted task reached a terminal state and no
# session lease leaked. Exits non-zero if anything was lost or leaked.
#
#   CHAOS_TASKS        tasks to submit (default 90)
#   CHAOS_PG_RESTART   1 to restart Postgres mid-run (default 1)
#   CHAOS_TIMEOUT      seconds to wait for recovery (default 150)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TASKS=${CHAOS_TASKS:-90}
PG_RESTART=${CHAOS_PG_RESTART:-1}
TIMEOUT=${CHAOS_TIMEOUT:-150}
WORK=$(mktemp -d -t agentq-chaos.XXXXXX)
DB="chaos_$$"
REDIS_DB=14
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
  psql -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
  redis-cli -h 127.0.0.1 -n "$REDIS_DB" flushdb >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
say() { echo "chaos: $*" >&2; }

bash scripts/services.sh >/dev/null
go build -o "$WORK/agentq" ./cmd/agentq
psql -q -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE $DB" >/dev/null
redis-cli -h 127.0.0.1 -n "$REDIS_DB" flushdb >/dev/null
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
export DATABASE_URL="postgres://postgres@127.0.0.1:5432/$DB?sslmode=disable"
export REDIS_URL="redis://127.0.0.1:6379/$REDIS_DB"
export AGENTQ_ADMIN_TOKEN="chaos-$$" AGENTQ_HTTP_ADDR="127.0.0.1:$PORT" AGENTQ_JANITOR_INTERVAL=2s AGENTQ_SHUTDOWN_TIMEOUT=2s
BASE="http://127.0.0.1:$PORT"

serve() {
  "$WORK/agentq" serve >>"$WORK/serve.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 150); do curl -fsS "$BASE/healthz" >/dev/null 2>&1 && return 0; sleep 0.2; done
  tail -20 "$WORK/serve.log"; say "server did not become healthy"; exit 1
}
admin() { curl -sS -X "$1" -H "Authorization: Bearer $AGENTQ_ADMIN_TOKEN" -H 'Content-Type: application/json' ${3:+-d "$3"} "$BASE$2"; }

serve
KEYS=()
for t in c1 c2 c3; do
  admin POST /v1/admin/tenants "{\"id\":\"$t\",\"plan\":\"pro\",\"overrides\":{\"concurrent_sessions\":10000,\"queue_backlog\":100000,\"agent_steps_daily\":10000000,\"tenant_rate\":10000,\"tenant_rate_burst\":10000,\"running\":3}}" >/dev/null
  KEYS+=("$(admin POST "/v1/admin/tenants/$t/keys" '{}' | python3 -c 'import sys,json;print(json.load(sys.stdin)["key"])')")
done

say "submitting $TASKS tasks from 3 tenants"
accepted=0
: >"$WORK/ids"
for i in $(seq 1 "$TASKS"); do
  k=${KEYS[$((i % 3))]}
  out=$(curl -sS -w '\n%{http_code}' -X POST -H "Authorization: Bearer $k" -H 'Content-Type: application/json' \
    -d '{"agent":"sim","input":{"steps":5,"step_ms":1000}}' "$BASE/v1/tasks")
  if [ "$(tail -1 <<<"$out")" = 202 ]; then
    accepted=$((accepted + 1))
    echo "$(head -1 <<<"$out" | python3 -c 'import sys,json;print(json.load(sys.stdin)["id"])')" >>"$WORK/ids"
  fi
done

sleep 1
at_fault=$(psql -qtA -h 127.0.0.1 -U postgres -d "$DB" -c "SELECT count(*) FILTER (WHERE state = 'queued') || ' queued, ' || count(*) FILTER (WHERE state = 'running') || ' running, ' || count(*) FILTER (WHERE state = 'completed') || ' completed' FROM tasks")
say "at the fault: $at_fault"
say "FLUSHDB Redis"
redis-cli -h 127.0.0.1 -n "$REDIS_DB" flushdb >/dev/null
sleep 1
say "kill -9 the server, then restart it"
kill -9 "${PIDS[-1]}"; sleep 0.5
t0=$(date +%s.%N)
serve
if [ "$PG_RESTART" = 1 ]; then
  sleep 2
  say "restart Postgres"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main restart >/dev/null 2>&1 || { say "could not restart Postgres (skipped)"; PG_RESTART=0; }
fi

say "waiting up to ${TIMEOUT}s for every accepted task to end"
deadline=$((SECONDS + TIMEOUT))
q() { psql -qtA -h 127.0.0.1 -U postgres -d "$DB" -c "$1" 2>/dev/null || echo ""; }
while [ $SECONDS -lt $deadline ]; do
  live=$(q "SELECT count(*) FROM tasks WHERE state IN ('queued','running')")
  [ "$live" = 0 ] && break
  sleep 1
done
recovery=$(python3 -c "import time;print(round(time.time()-$t0,1))")
sleep 5 # let releases land
terminal=$(q "SELECT count(*) FROM tasks WHERE state IN ('completed','failed','killed','budget_exceeded','abandoned')")
completed=$(q "SELECT count(*) FROM tasks WHERE state = 'completed'")
present=$(q "SELECT count(*) FROM tasks")
reexecuted=$(q "SELECT count(*) FROM tasks WHERE attempt > 1")
miscounted=$(q "SELECT count(*) FROM tasks t WHERE t.steps <> (SELECT count(*) FROM usage_ledger l WHERE l.task_id = t.id AND l.meter = 'steps')")
leaked=0
for k in "${KEYS[@]}"; do
  used=$(curl -sS -H "Authorization: Bearer $k" "$BASE/v1/usage" | python3 -c 'import sys,json;print(json.load(sys.stdin)["limits"]["concurrent_sessions"]["used"])')
  leaked=$((leaked + ${used%.*}))
done
lost=$((accepted - terminal))
[ "$present" -lt "$accepted" ] && lost=$((accepted - present + (present - terminal)))
cat <<JSON
{"accepted": $accepted, "terminal": $terminal, "completed": $completed, "lost": $lost, "leaked_leases": $leaked, "duplicate_executions": $reexecuted, "steps_miscounted": $miscounted, "recovery_s": $recovery, "postgres_restarted": $PG_RESTART, "at_fault": "$at_fault"}
JSON
if [ "$lost" != 0 ] || [ "$leaked" != 0 ] || [ "$miscounted" != 0 ]; then
  say "FAILED: lost $lost, leaked leases $leaked, tasks whose steps disagree with the ledger $miscounted"
  tail -30 "$WORK/serve.log" >&2
  exit 1
fi
say "ok: nothing lost, nothing leaked"
