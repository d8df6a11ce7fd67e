#!/usr/bin/env bash
# A team tracking server: `mlflow server` on a PostgreSQL backend store (a private cluster in DIR)
# with proxied artifacts in DIR/artifacts.
#
#   scripts/team_server.sh start|stop|status [--port P] [--dir D] [--host H] [--workers W]
#                          [--allowed-hosts LIST]
#
# start   creates the cluster (first time), starts PostgreSQL and `mlflow server` in the background
#         (pid file DIR/mlflow.pid, log DIR/mlflow.log), waits until it answers and prints the
#         MLFLOW_TRACKING_URI to export. Starting a running server only prints its URI.
# stop    stops mlflow server, then PostgreSQL. The database and artifacts stay in DIR.
# status  exit 0 when both run and the server answers, 3 when stopped, 1 when half up.
#
# Layout of DIR: pg/data (the cluster), pg/run (its Unix socket; PostgreSQL listens on no TCP port),
# pg/postgres.log, artifacts/, mlflow.pid, mlflow.log, server.env (what start chose).
# PostgreSQL refuses to run as root: as root, the cluster belongs to $PG_USER (default postgres, the
# user Debian's `postgresql` package creates) and runs under `runuser`; that user must be able to
# enter DIR. The server has no authentication: keep --host 127.0.0.1 unless the network is trusted;
# with --host 0.0.0.0, mlflow also wants --allowed-hosts (e.g. "mlflow.example.org,10.0.0.5:5000").
set -euo pipefail

usage() {
    sed -n '5,6p' "$0" | sed 's/^# *//' >&2
    exit 2
}

ACTION=${1:-}
case "$ACTION" in start|stop|status) shift ;; *) usage ;; esac
PORT=5000
HOST=127.0.0.1
WORKERS=2
ALLOWED_HOSTS=""
DIR=${TEAM_SERVER_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/cascade-team-server}
while [ $# -gt 0 ]; do
    case "$1" in
        --port) PORT=${2:?--port needs a value}; shift 2 ;;
        --dir) DIR=${2:?--dir needs a value}; shift 2 ;;
        --host) HOST=${2:?--host needs a value}; shift 2 ;;
        --workers) WORKERS=${2:?--workers needs a value}; shift 2 ;;
        --allowed-hosts) ALLOWED_HOSTS=${2:?--allowed-hosts needs a value}; shift 2 ;;
        -h|--help) usage ;;
        *) echo "team_server: unknown argument $1" >&2; usage ;;
    esac
done
case "$PORT" in ''|*[!0-9]*) echo "team_server: --port must be a number, got $PORT" >&2; exit 2 ;; esac

REPO=$(cd "$(dirname "$0")/.." && pwd)
if [ -x "$REPO/.venv/bin/mlflow" ]; then
    VENV_BIN="$REPO/.venv/bin"
else
    VENV_BIN=$(dirname "$(command -v mlflow || echo /nonexistent/mlflow)")
fi
MLFLOW="$VENV_BIN/mlflow"
PYTHON="$VENV_BIN/python"

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
PG_HOME="$DIR/pg"
PGDATA="$PG_HOME/data"
PGSOCK="$PG_HOME/run"
PGLOG="$PG_HOME/postgres.log"
PGPORT=5432  # names the socket file only: no TCP listener
DB=mlflow
DB_USER=mlflow
PIDFILE="$DIR/mlflow.pid"
LOG="$DIR/mlflow.log"
ENVFILE="$DIR/server.env"
BACKEND="postgresql+psycopg2://$DB_USER@/$DB?host=$PGSOCK&port=$PGPORT"

# The PostgreSQL binaries: $PG_BIN, else the newest /usr/lib/postgresql/*/bin, else PATH.
find_pg_bin() {
    if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return; fi
    local newest
    newest=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$newest" ] && [ -x "$newest/initdb" ]; then echo "$newest"; return; fi
    if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
    echo ""
}

# Run a command as the cluster's owner (PostgreSQL refuses root).
if [ "$(id -u)" -eq 0 ]; then
    PG_USER=${PG_USER:-postgres}
    as_pg() { runuser -u "$PG_USER" -- "$@"; }
else
    PG_USER=$(id -un)
    as_pg() { "$@"; }
fi

pg_running() {
    [ -n "$PG_BIN" ] && [ -f "$PGDATA/PG_VERSION" ] && as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1
}

mlflow_pid() {
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi
}

saved_port() {
    sed -n 's/^PORT=//p' "$ENVFILE" 2>/dev/null || true
}

answers() {  # answers URL: the server's /health says OK
    "$PYTHON" - "$1" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/health", timeout=2) as r:
    sys.exit(0 if r.status == 200 else 1)
EOF
}

client_host() {  # the address clients on this machine use
    case "$HOST" in 0.0.0.0|::|'') echo 127.0.0.1 ;; *) echo "$HOST" ;; esac
}

PG_BIN=$(find_pg_bin)

start_postgres() {
    if [ -z "$PG_BIN" ]; then
        echo "team_server: PostgreSQL binaries not found (install Debian's postgresql package, or set PG_BIN)" >&2
        exit 1
    fi
    if [ "$(id -u)" -eq 0 ] && ! id "$PG_USER" >/dev/null 2>&1; then
        echo "team_server: user $PG_USER does not exist (PostgreSQL does not run as root; set PG_USER)" >&2
        exit 1
    fi
    local sock="$PGSOCK/.s.PGSQL.$PGPORT"
    if [ ${#sock} -gt 100 ]; then
        echo "team_server: the socket path $sock is too long for a Unix socket; choose a shorter --dir" >&2
        exit 1
    fi
    mkdir -p "$PG_HOME"
    chmod 700 "$PG_HOME"
    if [ "$(id -u)" -eq 0 ]; then
        chown "$PG_USER:" "$PG_HOME"
        if ! as_pg test -w "$PG_HOME"; then
            echo "team_server: user $PG_USER cannot enter $DIR (a parent directory is closed to it);" \
                 "choose a --dir it can reach, e.g. under /srv or /var/lib" >&2
            exit 1
        fi
    fi
    if [ ! -f "$PGDATA/PG_VERSION" ]; then
        echo "team_server: creating a PostgreSQL cluster in $PGDATA (owner $PG_USER)"
        # trust on the Unix socket only: it lies in a directory that only $PG_USER (and root) can enter
        as_pg "$PG_BIN/initdb" -D "$PGDATA" -U "$DB_USER" --auth-local=trust --auth-host=reject \
            -E UTF8 --locale=C >"$PG_HOME/initdb.log" 2>&1 \
            || { echo "team_server: initdb failed:" >&2; cat "$PG_HOME/initdb.log" >&2; exit 1; }
    fi
    as_pg mkdir -p "$PGSOCK"
    as_pg chmod 700 "$PGSOCK"
    if ! pg_running; then
        as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -l "$PGLOG" -w -t 60 \
            -o "-c listen_addresses='' -c unix_socket_directories='$PGSOCK' -p $PGPORT" start >/dev/null \
            || { echo "team_server: PostgreSQL did not start; its log:" >&2; tail -n 30 "$PGLOG" >&2; exit 1; }
    fi
    if ! as_pg "$PG_BIN/psql" -h "$PGSOCK" -p "$PGPORT" -U "$DB_USER" -d postgres -tAc \
            "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1; then
        as_pg "$PG_BIN/createdb" -h "$PGSOCK" -p "$PGPORT" -U "$DB_USER" "$DB"
    fi
}

start() {
    local pid port url
    pid=$(mlflow_pid)
    if [ -n "$pid" ]; then
        port=$(saved_port)
        echo "team_server: already running (pid $pid, port ${port:-?}, dir $DIR)"
        echo "export MLFLOW_TRACKING_URI=http://$(client_host):${port:-$PORT}"
        return 0
    fi
    if [ ! -x "$MLFLOW" ]; then
        echo "team_server: mlflow not found (run scripts/setup.sh)" >&2
        exit 1
    fi
    "$PYTHON" -c "import psycopg2" 2>/dev/null \
        || { echo "team_server: the psycopg2 driver is missing from $VENV_BIN (run scripts/setup.sh)" >&2; exit 1; }
    start_postgres
    mkdir -p "$DIR/artifacts"
    url="http://$(client_host):$PORT"
    if answers "$url"; then
        echo "team_server: something already answers on $url; choose another --port" >&2
        exit 1
    fi
    printf 'PORT=%s\nHOST=%s\nBACKEND=%s\n' "$PORT" "$HOST" "$BACKEND" >"$ENVFILE"
    local extra=()
    if [ -n "$ALLOWED_HOSTS" ]; then extra=(--allowed-hosts "$ALLOWED_HOSTS"); fi
    # its own session (setsid), so stop ends the server and its workers together
    MLFLOW_ENABLE_TELEMETRY=${MLFLOW_ENABLE_TELEMETRY:-false} DO_NOT_TRACK=${DO_NOT_TRACK:-1} \
        setsid "$MLFLOW" server --backend-store-uri "$BACKEND" \
        --artifacts-destination "$DIR/artifacts" --serve-artifacts \
        --default-artifact-root mlflow-artifacts:/ \
        --host "$HOST" --port "$PORT" --workers "$WORKERS" "${extra[@]}" \
        >"$LOG" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$PIDFILE"
    local deadline=$((SECONDS + ${TEAM_SERVER_TIMEOUT:-120}))
    until answers "$url"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "team_server: mlflow server exited; the end of $LOG:" >&2
            tail -n 30 "$LOG" >&2
            stop >/dev/null
            exit 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            echo "team_server: $url did not answer within ${TEAM_SERVER_TIMEOUT:-120} s; the end of $LOG:" >&2
            tail -n 30 "$LOG" >&2
            stop >/dev/null
            exit 1
        fi
        sleep 0.5
    done
    echo "team_server: mlflow server (pid $pid) on $url, PostgreSQL store in $PGDATA, artifacts in $DIR/artifacts"
    echo "export MLFLOW_TRACKING_URI=$url"
}

stop_mlflow() {
    local pid
    pid=$(mlflow_pid)
    if [ -n "$pid" ]; then
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 40); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
        echo "team_server: mlflow server (pid $pid) stopped"
    fi
    rm -f "$PIDFILE"
}

stop() {
    stop_mlflow
    if pg_running; then
        as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
        echo "team_server: PostgreSQL stopped ($PGDATA kept)"
    fi
}

status() {
    local pid port pg=no
    pid=$(mlflow_pid)
    port=$(saved_port)
    pg_running && pg=yes
    if [ -n "$pid" ] && [ "$pg" = yes ] && answers "http://$(client_host):${port:-$PORT}"; then
        echo "team_server: running (mlflow pid $pid, PostgreSQL up, dir $DIR)"
        echo "export MLFLOW_TRACKING_URI=http://$(client_host):${port:-$PORT}"
        return 0
    fi
    if [ -z "$pid" ] && [ "$pg" = no ]; then
        echo "team_server: stopped (dir $DIR)"
        return 3
    fi
    echo "team_server: half up (mlflow pid ${pid:-none}, PostgreSQL up: $pg); run stop, then start" >&2
    return 1
}

case "$ACTION" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) usage ;;
esac
