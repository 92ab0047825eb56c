#!/usr/bin/env bash
# Airflow UI on loopback with a moto S3 server and the demo data (README: "Airflow UI").
#
#   scripts/airflow_standalone.sh            start everything in the foreground; Ctrl-C stops everything
#   scripts/airflow_standalone.sh start -d   start in the background (returns when the UI is up)
#   scripts/airflow_standalone.sh stop       stop a background instance (no processes are left)
#   scripts/airflow_standalone.sh status     is it running? prints URL and credentials
#   scripts/airflow_standalone.sh backfill --dag-id D --from-date ISO --to-date ISO [--reprocess-behavior
#        completed] [--max-active-runs N] [--wait]: create a backfill once the DAG's previous backfill is
#        complete (Airflow allows one running backfill per DAG; says which one is still running)
#   scripts/airflow_standalone.sh airflow …  run an `airflow` CLI command against this instance, e.g.
#        scripts/airflow_standalone.sh airflow backfill create --dag-id epochal_orders_payments \
#            --from-date 2026-11-21T06:00:00Z --to-date 2026-11-21T06:10:00Z --max-active-runs 1
#
# What it starts (each in its own process group, so stopping kills whole groups):
#   * `python -m pipeline.testing.moto_server` on 127.0.0.1 (bucket `epochal`; in memory);
#   * the demo data (orders + payments) for the last EPOCHAL_DEMO_EPOCHS epochs, in s3://epochal/demo/sources;
#   * `airflow standalone` (api-server with the UI, scheduler, dag-processor, triggerer; LocalExecutor,
#     SimpleAuthManager) on http://127.0.0.1:${AIRFLOW_PORT:-8080}, AIRFLOW_HOME=.epochal/airflow (git-ignored),
#     with dags/ and plugins/ of this repo. Airflow reads S3 through the connection `epochal_s3`
#     (AIRFLOW_CONN_EPOCHAL_S3), not from DAG code.
#
# Knobs (environment): AIRFLOW_PORT (8080), PIPELINE_EPOCH_SECONDS (60), EPOCHAL_DEMO_EPOCHS (12),
# EPOCHAL_DEMO_ORDERS_PER_EPOCH (500), EPOCHAL_DEMO_PARTITIONS (2), EPOCHAL_START_DATE (default: the first
# demo epoch), EPOCHAL_END_DATE (none), EPOCHAL_CATCHUP (true), EPOCHAL_AIRFLOW_HOME, EPOCHAL_S3_PORT (0 = any free port),
# EPOCHAL_READY_TIMEOUT (240 s), EPOCHAL_SPARK_CONNECT (0; 1: start a Spark Connect server that every task uses),
# EPOCHAL_CONNECT_PORT (15002), EPOCHAL_CONNECT_MASTER (local[*]), EPOCHAL_FUSED_EPOCH (false; true: the epoch DAG is
# trigger >> epoch, docs/airflow.md "Fast epochs").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

CMD="${1:-start}"
[ $# -gt 0 ] && shift
export AIRFLOW_HOME="${EPOCHAL_AIRFLOW_HOME:-$ROOT/.epochal/airflow}"
STATE="$AIRFLOW_HOME/epochal-standalone"
mkdir -p "$STATE"
PORT="${AIRFLOW_PORT:-8080}"
URL="http://127.0.0.1:$PORT"

log() { echo "[airflow-standalone] $*" >&2; }

group_alive() { [ -n "${1:-}" ] && kill -0 -- "-$1" 2>/dev/null; }

kill_group() {  # kill_group PGID NAME: TERM the whole process group, then KILL what is left
  local pgid="$1" name="$2" i
  group_alive "$pgid" || return 0
  log "stopping $name (process group $pgid)"
  kill -TERM -- "-$pgid" 2>/dev/null || true
  for i in $(seq 1 40); do group_alive "$pgid" || return 0; sleep 0.5; done
  log "$name did not stop within 20 s: killing process group $pgid"
  kill -KILL -- "-$pgid" 2>/dev/null || true
  for i in $(seq 1 20); do group_alive "$pgid" || return 0; sleep 0.5; done
  log "WARNING: processes of group $pgid are still alive"
  return 1
}

stop_all() {
  local rc=0
  [ -f "$STATE/airflow.pgid" ] && { kill_group "$(cat "$STATE/airflow.pgid")" "airflow standalone" || rc=1; }
  [ -f "$STATE/connect.pgid" ] && { kill_group "$(cat "$STATE/connect.pgid")" "Spark Connect server" || rc=1; }
  [ -f "$STATE/moto.pgid" ] && { kill_group "$(cat "$STATE/moto.pgid")" "moto S3 server" || rc=1; }
  rm -f "$STATE/airflow.pgid" "$STATE/moto.pgid" "$STATE/connect.pgid" "$STATE/ready"
  return $rc
}

env_file() { echo "$STATE/env.sh"; }

print_info() {
  local pw="(see $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated)"
  if [ -f "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated" ]; then
    pw="$("$ROOT/.venv/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("admin","?"))' \
      "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated")"
  fi
  cat >&2 <<EOF

  Airflow UI     $URL      (user: admin   password: $pw)
  Checkpoints    $URL/plugin/epochal-checkpoints   (Browse > Epochal checkpoints)
  S3 (moto)      $(cat "$STATE/endpoint" 2>/dev/null)   bucket epochal, prefix demo/ (credentials testing/testing)
  AIRFLOW_HOME   $AIRFLOW_HOME   (logs: $STATE/standalone.log)

  1. Turn on DAG epochal_orders_payments: one run per ${PIPELINE_EPOCH_SECONDS:-60}s epoch, catching up the demo data.
  2. Backfill / re-run: Trigger > Backfill in the UI, or (waits for the previous backfill to complete)
       $0 backfill --dag-id epochal_orders_payments --from-date <ISO> --to-date <ISO> \\
           [--reprocess-behavior completed] --max-active-runs 1
  3. Savepoint: trigger epochal_orders_payments_savepoint (params form); restore: epochal_orders_payments_restore.
  4. Checkpoint history: Browse > Epochal checkpoints.
  Stop: Ctrl-C (foreground) or $0 stop
EOF
}

case "$CMD" in
  stop)
    stop_all && log "stopped; no processes left" ; exit $? ;;
  status)
    if [ -f "$STATE/airflow.pgid" ] && group_alive "$(cat "$STATE/airflow.pgid")"; then
      log "running"; print_info; exit 0
    fi
    log "not running"; exit 1 ;;
  airflow)
    [ -f "$(env_file)" ] || { log "not started (no $(env_file))"; exit 2; }
    # shellcheck disable=SC1090
    source "$(env_file)"
    exec "$ROOT/.venv/bin/airflow" "$@" ;;
  backfill)
    [ -f "$(env_file)" ] || { log "not started (no $(env_file))"; exit 2; }
    # shellcheck disable=SC1090
    source "$(env_file)"
    exec "$ROOT/.venv/bin/python" -m pipeline.orchestration.backfills --url "$URL" \
      --password-file "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated" create "$@" ;;
  start) ;;
  *) echo "usage: $0 [start [-d]|stop|status|backfill ARGS...|airflow ARGS...]" >&2; exit 2 ;;
esac

BACKGROUND=0
[ "${1:-}" = "-d" ] && BACKGROUND=1

if [ -f "$STATE/airflow.pgid" ] && group_alive "$(cat "$STATE/airflow.pgid")"; then
  log "already running (process group $(cat "$STATE/airflow.pgid")); '$0 stop' first"; exit 1
fi
stop_all >/dev/null 2>&1 || true

[ -x .venv/bin/python ] || scripts/bootstrap.sh
PY="$ROOT/.venv/bin/python"
export PATH="$ROOT/.venv/bin:$PATH"
export PYSPARK_PYTHON="$PY"

cleanup() {
  trap - INT TERM EXIT
  stop_all || true
}
if [ "$BACKGROUND" = 0 ]; then
  trap 'log "interrupted"; cleanup; exit 130' INT TERM
  trap cleanup EXIT
else
  trap 'stop_all >/dev/null 2>&1 || true' ERR
fi

# 1. moto S3 on loopback, own process group
: > "$STATE/moto.out"
setsid "$PY" -m pipeline.testing.moto_server --host 127.0.0.1 --port "${EPOCHAL_S3_PORT:-0}" --bucket epochal \
  > "$STATE/moto.out" 2>"$STATE/moto.err" < /dev/null &
echo $! > "$STATE/moto.pgid"
for _ in $(seq 1 200); do grep -q '^ENDPOINT=' "$STATE/moto.out" 2>/dev/null && break; sleep 0.1; done
ENDPOINT="$(grep '^ENDPOINT=' "$STATE/moto.out" | head -1 | cut -d= -f2-)"
[ -n "$ENDPOINT" ] || { log "moto S3 server did not start: $(cat "$STATE/moto.err")"; exit 1; }
log "moto S3 server at $ENDPOINT"
echo "$ENDPOINT" > "$STATE/endpoint"

# 1b. optionally (EPOCHAL_SPARK_CONNECT=1) a long-lived Spark Connect server, own process group: every Airflow task
#     connects to it (PIPELINE_SPARK_MASTER=sc://...) instead of starting a driver JVM of its own
SPARK_MASTER_LINE=""
if [ "${EPOCHAL_SPARK_CONNECT:-0}" = 1 ]; then
  : > "$STATE/connect.out"
  AWS_ENDPOINT_URL="$ENDPOINT" AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1 \
    setsid "$PY" -m pipeline.testing.connect_server --port "${EPOCHAL_CONNECT_PORT:-15002}" \
    --master "${EPOCHAL_CONNECT_MASTER:-local[*]}" > "$STATE/connect.out" 2>&1 < /dev/null &
  echo $! > "$STATE/connect.pgid"
  for _ in $(seq 1 1200); do grep -q '^SPARK_CONNECT=' "$STATE/connect.out" 2>/dev/null && break; sleep 0.25; done
  CONNECT_URL="$(grep '^SPARK_CONNECT=' "$STATE/connect.out" | head -1 | cut -d= -f2 | cut -d' ' -f1)"
  [ -n "$CONNECT_URL" ] || { log "Spark Connect server did not start: $(tail -5 "$STATE/connect.out")"; exit 1; }
  log "Spark Connect server at $CONNECT_URL"
  SPARK_MASTER_LINE="export PIPELINE_SPARK_MASTER='$CONNECT_URL'"
fi

# 2. demo data for the last N epochs (ending at the last epoch boundary before now)
E="${PIPELINE_EPOCH_SECONDS:-60}"
N="${EPOCHAL_DEMO_EPOCHS:-12}"
DATA_START="$("$PY" -c 'import sys,time; e=int(sys.argv[1]); n=int(sys.argv[2]); now=int(time.time()); import datetime as d; print(d.datetime.fromtimestamp(now-now%e-n*e, d.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))' "$E" "$N")"
log "generating $N epochs of demo data (epoch ${E}s, from $DATA_START) into s3://epochal/demo/sources"
AWS_ENDPOINT_URL="$ENDPOINT" AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1 \
  "$PY" -m pipeline.demo.generate --root s3://epochal/demo/sources --epochs "$N" --epoch-seconds "$E" \
  --start "$DATA_START" --orders-per-epoch "${EPOCHAL_DEMO_ORDERS_PER_EPOCH:-500}" \
  --partitions "${EPOCHAL_DEMO_PARTITIONS:-2}" > "$STATE/generate.json"

# 3. Airflow environment (written to env.sh for `$0 airflow ...` and for tests)
cat > "$(env_file)" <<EOF
export AIRFLOW_HOME='$AIRFLOW_HOME'
export PATH='$ROOT/.venv/bin':"\$PATH"
export PYSPARK_PYTHON='$PY'
export AIRFLOW__CORE__DAGS_FOLDER='$ROOT/dags'
export AIRFLOW__CORE__PLUGINS_FOLDER='$ROOT/plugins'
export AIRFLOW__CORE__LOAD_EXAMPLES=false
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN='${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-sqlite:///$AIRFLOW_HOME/airflow.db?timeout=60}'
export AIRFLOW__CORE__PARALLELISM=${AIRFLOW__CORE__PARALLELISM:-4}
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS='admin:admin'
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL='$URL/execution/'
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=$PORT
export AIRFLOW__API__BASE_URL='$URL'
export AIRFLOW__API__WORKERS=1
export AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL=${AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL:-30}
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=${AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL:-30}
export AIRFLOW_CONN_EPOCHAL_S3='{"conn_type": "aws", "login": "testing", "password": "testing", "extra": {"endpoint_url": "$ENDPOINT", "region_name": "us-east-1"}}'
export EPOCHAL_AWS_CONN_ID=epochal_s3
export PIPELINE_SOURCE_URI=s3://epochal/demo/sources
export PIPELINE_CHECKPOINT_URI=s3://epochal/demo/checkpoints
export PIPELINE_SINK_URI=s3://epochal/demo/sinks
export PIPELINE_EPOCH_SECONDS=$E
export PIPELINE_PARALLELISM=${PIPELINE_PARALLELISM:-2}
export PIPELINE_RETAINED_CHECKPOINTS=${PIPELINE_RETAINED_CHECKPOINTS:-10}
export EPOCHAL_START_DATE='${EPOCHAL_START_DATE:-$DATA_START}'
export EPOCHAL_CATCHUP=${EPOCHAL_CATCHUP:-true}
export EPOCHAL_END_DATE='${EPOCHAL_END_DATE:-}'
export EPOCHAL_POKE_SECONDS=${EPOCHAL_POKE_SECONDS:-5}
export EPOCHAL_DAG_RETRY_DELAY_SECONDS=${EPOCHAL_DAG_RETRY_DELAY_SECONDS:-10}
$SPARK_MASTER_LINE
EOF
# shellcheck disable=SC1090
source "$(env_file)"

# 4. airflow standalone in its own process group
log "starting airflow standalone on $URL (AIRFLOW_HOME=$AIRFLOW_HOME)"
setsid airflow standalone > "$STATE/standalone.log" 2>&1 < /dev/null &
echo $! > "$STATE/airflow.pgid"
deadline=$(( $(date +%s) + ${EPOCHAL_READY_TIMEOUT:-240} ))
until "$PY" - "$URL" <<'PYEOF' 2>/dev/null
import json, sys, urllib.request
h = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v2/monitor/health", timeout=3))
ok = all((h.get(k) or {}).get("status") == "healthy" for k in ("metadatabase", "scheduler", "dag_processor"))
sys.exit(0 if ok else 1)
PYEOF
do
  if ! group_alive "$(cat "$STATE/airflow.pgid")"; then log "airflow standalone exited; see $STATE/standalone.log"; tail -20 "$STATE/standalone.log" >&2; exit 1; fi
  if [ "$(date +%s)" -gt "$deadline" ]; then log "Airflow was not healthy in time; see $STATE/standalone.log"; exit 1; fi
  sleep 2
done
touch "$STATE/ready"
log "ready"
print_info

if [ "$BACKGROUND" = 1 ]; then
  trap - ERR
  exit 0
fi
log "press Ctrl-C to stop"
while group_alive "$(cat "$STATE/airflow.pgid" 2>/dev/null)"; do sleep 1; done
log "airflow standalone exited; see $STATE/standalone.log"
