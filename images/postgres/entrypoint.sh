#!/usr/bin/env bash
# Start PostgreSQL for the service replicas: on the first start make the cluster, the `sandbox`
# role (its password from $SANDBOX_PG_PASSWORD, or from the file $SANDBOX_PG_PASSWORD_FILE) and
# the `sandbox` database. Logins need that password (scram-sha-256), on every address.
# It listens where $SANDBOX_PG_LISTEN says (default 127.0.0.1) on $SANDBOX_PG_PORT (default 5432).
set -euo pipefail
bin=$(echo /usr/lib/postgresql/*/bin)
password="${SANDBOX_PG_PASSWORD:-}"
if [ -z "$password" ] && [ -n "${SANDBOX_PG_PASSWORD_FILE:-}" ]; then
  password=$(cat "$SANDBOX_PG_PASSWORD_FILE")
fi
unset SANDBOX_PG_PASSWORD  # the server and its backends never carry it in their environment
ready="$PGDATA/.sandbox-ready"
if [ -s "$PGDATA/PG_VERSION" ] && [ ! -e "$ready" ]; then
  # a first start that did not finish (the role or the database missing): made again from scratch
  echo "sandbox-postgres: the last setup did not finish; making the cluster again" >&2
  find "$PGDATA" -mindepth 1 -delete
fi
if [ ! -e "$ready" ]; then
  if [ -z "$password" ]; then
    echo "sandbox-postgres: set SANDBOX_PG_PASSWORD (or SANDBOX_PG_PASSWORD_FILE) for the sandbox role" >&2
    exit 1
  fi
  "$bin/initdb" -D "$PGDATA" -U postgres --auth-local=peer --auth-host=scram-sha-256 >/dev/null
  "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/tmp" -w start >/dev/null
  # the password reaches psql through its environment (\getenv), never its command line
  SBX_PW="$password" psql -h /tmp -U postgres -v ON_ERROR_STOP=1 -q <<'SQL'
\getenv pw SBX_PW
CREATE ROLE sandbox LOGIN PASSWORD :'pw';
CREATE DATABASE sandbox OWNER sandbox;
SQL
  "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  touch "$ready"
fi
exec "$bin/postgres" -D "$PGDATA" -c "listen_addresses=${SANDBOX_PG_LISTEN:-127.0.0.1}" \
  -c "port=${SANDBOX_PG_PORT:-5432}" -c unix_socket_directories=/tmp
