# A throw-away PostgreSQL for the tests (sourced by .ci/run; safe to rerun).
#
# Installs Debian's `postgresql` package when missing, creates (once) a cluster named
# evolve_ci owned by the `postgres` user, listening on 127.0.0.1 only (no Unix-socket
# trust for other users, password auth over TCP), starts it, makes a role and a database,
# and exports:
#   EVOLVE_TEST_POSTGRES_URL  postgresql+psycopg://evolve@127.0.0.1:PORT/evolve_test
#   PGPASSWORD                read by libpq (psycopg 3); the URL carries no password
# `ci_postgres_stop` stops the cluster (.ci/run calls it on exit). Every failure stops the
# CI run with a message: a test that needs the database must not silently skip.

CI_PG_CLUSTER="evolve_ci"
CI_PG_PORT="${CI_PG_PORT:-54329}"
CI_PG_USER="evolve"
CI_PG_DB="evolve_test"
# A fixed password for a cluster that listens on 127.0.0.1 only and lives for the CI run.
CI_PG_PASSWORD="${CI_PG_PASSWORD:-evolve-ci-only}"

_ci_pg_fail() {
  echo "ci postgres: $*" >&2
  exit 1
}

_ci_as_root() {
  if [ "$(id -u)" = "0" ]; then "$@"; else sudo -n "$@"; fi
}

_ci_as_postgres() {
  if [ "$(id -u)" = "0" ]; then runuser -u postgres -- "$@"; else sudo -n -u postgres "$@"; fi
}

ci_postgres_start() {
  if ! command -v pg_createcluster >/dev/null 2>&1; then
    echo "ci postgres: installing the Debian postgresql package" >&2
    _ci_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      postgresql >/dev/null || {
      _ci_as_root apt-get update -q >/dev/null &&
        _ci_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
          --no-install-recommends postgresql >/dev/null
    } || _ci_pg_fail "apt-get install postgresql failed (needs root or passwordless sudo)"
  fi
  local version
  version="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
  [ -n "$version" ] || _ci_pg_fail "no PostgreSQL server under /usr/lib/postgresql"
  if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$version $CI_PG_CLUSTER"; then
    _ci_as_root pg_createcluster "$version" "$CI_PG_CLUSTER" --port "$CI_PG_PORT" \
      -- --auth-local=peer --auth-host=scram-sha-256 >/dev/null ||
      _ci_pg_fail "pg_createcluster $version $CI_PG_CLUSTER failed"
  fi
  local conf="/etc/postgresql/$version/$CI_PG_CLUSTER/postgresql.conf"
  _ci_as_root sed -i -E "s/^#?listen_addresses *=.*/listen_addresses = '127.0.0.1'/" "$conf" ||
    _ci_pg_fail "cannot edit $conf"
  local port
  port="$(pg_lsclusters -h | awk -v v="$version" -v c="$CI_PG_CLUSTER" '$1==v && $2==c {print $3}')"
  if ! pg_lsclusters -h | awk -v v="$version" -v c="$CI_PG_CLUSTER" '$1==v && $2==c {print $4}' |
    grep -qx online; then
    _ci_as_root pg_ctlcluster "$version" "$CI_PG_CLUSTER" start ||
      _ci_pg_fail "cluster $version/$CI_PG_CLUSTER did not start (see /var/log/postgresql/)"
  fi
  _ci_as_postgres psql -q -p "$port" -v ON_ERROR_STOP=1 -d postgres >/dev/null <<SQL ||
SELECT 'CREATE ROLE $CI_PG_USER LOGIN' WHERE NOT EXISTS
  (SELECT FROM pg_roles WHERE rolname = '$CI_PG_USER') \gexec
ALTER ROLE $CI_PG_USER PASSWORD '$CI_PG_PASSWORD';
SELECT 'CREATE DATABASE $CI_PG_DB OWNER $CI_PG_USER' WHERE NOT EXISTS
  (SELECT FROM pg_database WHERE datname = '$CI_PG_DB') \gexec
SQL
    _ci_pg_fail "could not create role $CI_PG_USER / database $CI_PG_DB"
  export PGPASSWORD="$CI_PG_PASSWORD"
  export EVOLVE_TEST_POSTGRES_URL="postgresql+psycopg://$CI_PG_USER@127.0.0.1:$port/$CI_PG_DB"
  CI_PG_VERSION="$version"
  psql "postgresql://$CI_PG_USER@127.0.0.1:$port/$CI_PG_DB" -qAtc "select 1" >/dev/null ||
    _ci_pg_fail "cannot connect to $EVOLVE_TEST_POSTGRES_URL"
  echo "ci postgres: PostgreSQL $version cluster $CI_PG_CLUSTER on 127.0.0.1:$port" \
    "(EVOLVE_TEST_POSTGRES_URL=$EVOLVE_TEST_POSTGRES_URL)" >&2
}

ci_postgres_stop() {
  if [ -n "${CI_PG_VERSION:-}" ]; then
    _ci_as_root pg_ctlcluster "$CI_PG_VERSION" "$CI_PG_CLUSTER" stop || true
  fi
}
