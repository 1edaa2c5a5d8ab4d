#!/usr/bin/env bash
# The services the tests and examples need, on this machine: Redis, PostgreSQL, MariaDB, RabbitMQ, NATS with JetStream,
# Chromium (headless, for @oncely/client's browser test), and what the SQS tests need to start their own fauxqs.
#
#   bash scripts/services.sh           install (Debian/Ubuntu packages) what is missing, start what is not running
#   bash scripts/services.sh --check   only say which are up; exit 1 if any is not
#
# Each is looked for where the tests look by default (127.0.0.1: Redis 6379, PostgreSQL 5432 with database `test`,
# MariaDB 3306 as root without password with database `test`, RabbitMQ 5672 guest/guest, NATS 4222); one already
# running there is left alone. A newly installed PostgreSQL is set to trust connections from loopback, and MariaDB's
# root to log in without password from 127.0.0.1, as the tests expect (a throwaway test database, nothing else).
# SQS: nothing runs here. Each SQS test file starts fauxqs (npm) on a free port, on a Node 22.5+: the running one, or
# the binary `npm run setup` installs from npm; this script says whether that works (or whether SQS_ENDPOINT answers).
# `npm run sqs-server` runs one on 127.0.0.1:4566 for examples.
# .ci/run calls this script; README.md tells people to: the two cannot drift. compose.yaml is the Docker way.
set -euo pipefail

REDIS_PORT=6379
PG_HOST=127.0.0.1
PG_PORT=5432
PG_DB=test
MYSQL_PORT=3306
MYSQL_DB=test
RABBITMQ_PORT=5672
NATS_PORT=4222
CHROMIUM=/usr/bin/chromium # Debian's; the browser test also takes a `chromium` on PATH

export DEBIAN_FRONTEND=noninteractive

log() { printf '==> %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    if [ -t 0 ]; then sudo "$@"; else sudo -n "$@"; fi
  else
    echo "scripts/services.sh: need root for: $*" >&2
    return 1
  fi
}

APT_UPDATED=0
apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "scripts/services.sh: no apt-get on this machine: install $* yourself, or use compose.yaml (docker compose up -d)" >&2
    exit 1
  fi
  if [ "$APT_UPDATED" -eq 0 ]; then
    as_root apt-get update -q </dev/null
    APT_UPDATED=1
  fi
  as_root apt-get install -y -q --no-install-recommends "$@" </dev/null
}

# wait_for <seconds> <command...>: retries the command once a second until it succeeds.
wait_for() {
  local seconds=$1
  shift
  local i
  for ((i = 0; i < seconds; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  "$@"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
redis_up() { [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]; }
pg_up() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT"; }

ensure_redis() {
  # The binaries too: tests start private redis-servers (to kill, pause, or build a Cluster).
  if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    log "installing redis"
    apt_install redis-server redis-tools
  fi
  if ! redis_up; then
    log "starting redis"
    as_root mkdir -p /var/lib/redis /var/log/redis
    as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
  fi
  wait_for 30 redis_up
  echo "redis: up on 127.0.0.1:$REDIS_PORT"
}

# A PostgreSQL server binary (initdb, postgres): on PATH, or in Debian's /usr/lib/postgresql/<version>/bin.
pg_binary() {
  command -v "$1" 2>/dev/null || find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path "*/bin/$1" 2>/dev/null |
    sort -V | tail -n 1
}

# The binaries too: tests start private PostgreSQL servers (initdb + postgres, as the postgres user when root) to
# kill and pause (packages/postgres/test/outages.test.ts, @services postgres-server).
ensure_postgres_binaries() {
  if [ -z "$(pg_binary initdb)" ] || [ -z "$(pg_binary postgres)" ] || ! command -v pg_isready >/dev/null 2>&1; then
    log "installing postgresql (server binaries)"
    apt_install postgresql postgresql-client
  fi
  if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
    echo "scripts/services.sh: no postgres user to run private PostgreSQL servers as (the postgresql package creates it)" >&2
    exit 1
  fi
  echo "postgres binaries: $(pg_binary initdb), $(pg_binary postgres)"
}

ensure_postgres() {
  if ! command -v pg_isready >/dev/null 2>&1 || ! pg_up; then
    local installed=0 version
    if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! command -v pg_isready >/dev/null 2>&1 ||
      ! command -v psql >/dev/null 2>&1 || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
      log "installing postgresql"
      apt_install postgresql postgresql-client
      installed=1
    fi
    version=$(find /etc/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n 1)
    if [ "$installed" -eq 1 ]; then
      as_root sed -i -E 's/^(host[[:space:]].*[[:space:]])(scram-sha-256|md5)[[:space:]]*$/\1trust/' \
        "/etc/postgresql/$version/main/pg_hba.conf"
    fi
    if pg_up; then
      as_root pg_ctlcluster --skip-systemctl-redirect "$version" main reload
    else
      log "starting postgresql $version"
      as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start
    fi
    wait_for 30 pg_up
  fi
  local exists
  exists=$(psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" </dev/null)
  if [ "$exists" != 1 ]; then
    log "creating database $PG_DB"
    psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -c "CREATE DATABASE $PG_DB" </dev/null
  fi
  echo "postgres: up on $PG_HOST:$PG_PORT, database $PG_DB"
  ensure_postgres_binaries
}

# A MariaDB binary: on PATH, or in /usr/sbin (Debian's, often not on a user's PATH); prints nothing if none.
mariadb_binary() {
  local name
  for name in "$@"; do
    if command -v "$name" 2>/dev/null; then return 0; fi
    if [ -x "/usr/sbin/$name" ]; then echo "/usr/sbin/$name"; return 0; fi
  done
}
mariadb_up() { mariadb -h 127.0.0.1 -P "$MYSQL_PORT" -uroot -e 'SELECT 1' </dev/null; }

# The binaries too: tests start private servers (mariadb-install-db + mariadbd) to kill and pause
# (packages/mysql/test/outages.test.ts, @services mariadb-server).
ensure_mariadb() {
  if [ -z "$(mariadb_binary mariadbd mysqld)" ] || [ -z "$(mariadb_binary mariadb-install-db mysql_install_db)" ] ||
    ! command -v mariadb >/dev/null 2>&1; then
    log "installing mariadb"
    apt_install mariadb-server mariadb-client
  fi
  if ! port_open "$MYSQL_PORT"; then
    log "starting mariadb"
    as_root mkdir -p /run/mysqld
    as_root chown mysql:mysql /run/mysqld
    # Its own config (Debian's: /etc/mysql) says the user (mysql), datadir, socket and port.
    as_root start-stop-daemon --start --oknodo --background --exec "$(mariadb_binary mariadbd mysqld)" </dev/null
    wait_for 60 port_open "$MYSQL_PORT"
  fi
  if ! wait_for 5 mariadb_up; then
    # Debian's root logs in only through the socket, as the OS root: let it in without password from loopback.
    log "letting root log in without password from 127.0.0.1"
    as_root mariadb -uroot -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
      GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
      ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
      FLUSH PRIVILEGES;" </dev/null
    mariadb_up
  fi
  mariadb -h 127.0.0.1 -P "$MYSQL_PORT" -uroot -e "CREATE DATABASE IF NOT EXISTS \`$MYSQL_DB\`" </dev/null
  echo "mariadb: up on 127.0.0.1:$MYSQL_PORT, database $MYSQL_DB"
  echo "mariadb binaries: $(mariadb_binary mariadbd mysqld), $(mariadb_binary mariadb-install-db mysql_install_db)"
}

ensure_rabbitmq() {
  if ! port_open "$RABBITMQ_PORT"; then
    if ! command -v rabbitmq-server >/dev/null 2>&1; then
      log "installing rabbitmq"
      apt_install rabbitmq-server
    fi
    log "starting rabbitmq"
    as_root rabbitmq-server -detached </dev/null
    wait_for 90 port_open "$RABBITMQ_PORT"
    # The broker accepts connections slightly before it accepts logins: wait for it to answer.
    wait_for 60 as_root rabbitmqctl await_startup
  fi
  echo "rabbitmq: up on 127.0.0.1:$RABBITMQ_PORT"
}

ensure_nats() {
  if ! port_open "$NATS_PORT"; then
    if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then
      log "installing nats-server"
      apt_install nats-server
    fi
    log "starting nats (JetStream)"
    as_root mkdir -p /var/lib/nats-server
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
      -a 127.0.0.1 -p "$NATS_PORT" -js -sd /var/lib/nats-server -l /var/log/nats-server.log </dev/null
    wait_for 30 port_open "$NATS_PORT"
  fi
  echo "nats: up on 127.0.0.1:$NATS_PORT"
}

# The Chromium binary the browser test would use: Debian's, or one on PATH; prints nothing if there is none.
chromium_bin() {
  if [ -x "$CHROMIUM" ]; then echo "$CHROMIUM"; else command -v chromium 2>/dev/null || true; fi
}

ensure_chromium() {
  # Not a service: a binary. The test drives it through playwright-core, which downloads no browser of its own.
  if [ -z "$(chromium_bin)" ]; then
    log "installing chromium"
    apt_install chromium
  fi
  echo "chromium: $("$(chromium_bin)" --version 2>/dev/null) at $(chromium_bin)"
}

ensure_promtool() {
  # Not a service either: Prometheus's promtool checks @oncely/opentelemetry's alert rules and runs their unit tests.
  if ! command -v promtool >/dev/null 2>&1; then
    log "installing prometheus (for promtool)"
    apt_install prometheus
  fi
  echo "promtool: $(promtool --version 2>&1 | head -1)"
}

# Whether the SQS tests can start fauxqs (scripts/sqs-server.mjs --check says how, or what is missing).
sqs_check() { node "$(dirname "${BASH_SOURCE[0]}")/sqs-server.mjs" --check; }

ensure_sqs() {
  # Before `npm run setup` (as in .ci/run), fauxqs and its Node are not installed yet: setup installs them.
  if ! sqs_check; then echo "sqs: npm run setup installs fauxqs and a Node 22 for it (node_modules)"; fi
}

check() {
  local down=0
  check_one() {
    if port_open "$2"; then echo "$1: up on 127.0.0.1:$2"; else echo "$1: not reachable on 127.0.0.1:$2"; down=1; fi
  }
  check_one redis "$REDIS_PORT"
  check_one postgres "$PG_PORT"
  check_one mariadb "$MYSQL_PORT"
  check_one rabbitmq "$RABBITMQ_PORT"
  check_one nats "$NATS_PORT"
  if command -v redis-server >/dev/null 2>&1; then echo "redis-server binary: $(command -v redis-server)"; else
    echo "redis-server binary: not on PATH (tests start private Redis servers from it)"
    down=1
  fi
  if [ -n "$(pg_binary initdb)" ] && [ -n "$(pg_binary postgres)" ]; then
    echo "postgres binaries: $(pg_binary initdb), $(pg_binary postgres)"
  else
    echo "postgres binaries: initdb or postgres not found (tests start private PostgreSQL servers from them)"
    down=1
  fi
  if [ -n "$(mariadb_binary mariadbd mysqld)" ] && [ -n "$(mariadb_binary mariadb-install-db mysql_install_db)" ]; then
    echo "mariadb binaries: $(mariadb_binary mariadbd mysqld), $(mariadb_binary mariadb-install-db mysql_install_db)"
  else
    echo "mariadb binaries: mariadbd or mariadb-install-db not found (tests start private MariaDB servers from them)"
    down=1
  fi
  if [ -n "$(chromium_bin)" ]; then echo "chromium binary: $(chromium_bin)"; else
    echo "chromium binary: not at $CHROMIUM nor on PATH (@oncely/client's browser test drives it)"
    down=1
  fi
  if command -v promtool >/dev/null 2>&1; then echo "promtool: $(command -v promtool)"; else
    echo "promtool: not on PATH (Debian's prometheus package; the alert rules' test needs it in CI)"
  fi
  sqs_check || down=1
  return "$down"
}

case "${1:-}" in
  --check) check ;;
  '')
    ensure_redis
    ensure_postgres
    ensure_mariadb
    ensure_rabbitmq
    ensure_nats
    ensure_chromium
    ensure_promtool
    ensure_sqs
    ;;
  *)
    echo "usage: bash scripts/services.sh [--check]" >&2
    exit 2
    ;;
esac
