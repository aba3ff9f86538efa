#!/usr/bin/env bash
# Makes sure the services agentq's tests need answer on 127.0.0.1: Redis on 6379 and
# PostgreSQL on 5432. A service that is down is started if its server is installed
# here (Debian packages: redis-server, postgresql). Used by `make test` and .ci/run.
#
# The tests themselves read AGENTQ_TEST_REDIS_URL (default redis://127.0.0.1:6379/9)
# and AGENTQ_TEST_DATABASE_URL (default
# postgres://postgres@127.0.0.1:5432/agentq_test?sslmode=disable; the test helper
# creates that database if it is missing). If you point those at services elsewhere,
# set AGENTQ_SKIP_SERVICES=1 to skip this script.
#
# Exits non-zero, saying what is missing and how to get it, if a service cannot be
# brought up within AGENTQ_SERVICES_WAIT seconds (default 30).
set -euo pipefail

if [[ "${AGENTQ_SKIP_SERVICES:-}" == "1" ]]; then
  echo "services: AGENTQ_SKIP_SERVICES=1, not checking Redis and Postgres"
  exit 0
fi

HOST=127.0.0.1
REDIS_PORT=6379
PG_PORT=5432
WAIT="${AGENTQ_SERVICES_WAIT:-30}"

die() {
  echo "" >&2
  echo "services: ERROR: $*" >&2
  exit 1
}

have() { command -v "$1" >/dev/null 2>&1; }

redis_up() {
  if have redis-cli; then
    [[ "$(redis-cli -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null)" == "PONG" ]]
  else
    # No client: speak RESP over bash's /dev/tcp.
    local reply
    reply="$({ exec 3<>"/dev/tcp/$HOST/$REDIS_PORT" &&
      printf 'PING\r\n' >&3 && timeout 2 head -c 5 <&3; } 2>/dev/null)" || return 1
    [[ "$reply" == "+PONG" ]]
  fi
}

pg_up() {
  if have pg_isready; then
    pg_isready -h "$HOST" -p "$PG_PORT" -t 2 >/dev/null 2>&1
  else
    (exec 3<>"/dev/tcp/$HOST/$PG_PORT") 2>/dev/null
  fi
}

wait_for() { # check-function: polls it every 0.5 s for up to $WAIT seconds
  local check=$1 i
  for ((i = 0; i < WAIT * 2; i++)); do
    if "$check"; then
      return 0
    fi
    sleep 0.5
  done
  return 1
}

# --- Redis ---------------------------------------------------------------------------
if redis_up; then
  echo "services: Redis answers on $HOST:$REDIS_PORT"
else
  if have redis-server; then
    echo "services: Redis is down; starting redis-server on $HOST:$REDIS_PORT"
    redis-server --daemonize yes --bind "$HOST" --port "$REDIS_PORT" --save "" --appendonly no ||
      die "redis-server failed to start (see its output above)."
  else
    die "Redis does not answer on $HOST:$REDIS_PORT and redis-server is not installed.
  Install it (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis),
  or run one in Docker: docker compose up -d redis"
  fi
  wait_for redis_up ||
    die "Redis was started but does not answer on $HOST:$REDIS_PORT after ${WAIT}s."
  echo "services: Redis is up"
fi

# --- PostgreSQL ----------------------------------------------------------------------
if pg_up; then
  echo "services: PostgreSQL answers on $HOST:$PG_PORT"
else
  if have pg_ctlcluster && [[ -d /etc/postgresql ]] && [[ -n "$(ls /etc/postgresql 2>/dev/null)" ]]; then
    version="$(ls /etc/postgresql | head -1)"
    echo "services: PostgreSQL is down; starting cluster $version/main"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start ||
      die "pg_ctlcluster could not start PostgreSQL $version/main (see its output above)."
  else
    die "PostgreSQL does not answer on $HOST:$PG_PORT and no local cluster can be started
  (pg_ctlcluster or /etc/postgresql is missing).
  Install it (Debian/Ubuntu: apt-get install postgresql), or run one in Docker:
  docker compose up -d postgres   (then set AGENTQ_TEST_DATABASE_URL to match its user)"
  fi
  wait_for pg_up ||
    die "PostgreSQL was started but does not answer on $HOST:$PG_PORT after ${WAIT}s."
  echo "services: PostgreSQL is up"
fi
