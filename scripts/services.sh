#!/usr/bin/env bash
# Start, stop and inspect the real services fleethealth's tests use: Kafka (KRaft, single node),
# Prometheus and Slurm (munge + slurmctld + slurmd). State, configs and logs live in .services/.
#
#   scripts/services.sh up     [kafka|prometheus|slurm|all ...] [--started-file FILE]
#   scripts/services.sh down   [kafka|prometheus|slurm|all ...]
#   scripts/services.sh status [kafka|prometheus|slurm|all ...]
#   scripts/services.sh deps            # apt-get install what is missing (prometheus, slurm, munge, java, maven,
#                                       # and chromium-headless-shell for the report's screenshot test)
#   scripts/services.sh env             # print the export lines clients need (SLURM_CONF, ...)
#
# `up` is idempotent: a service whose pid file names a live process is left alone. A service that is
# started gets fresh state (empty Kafka log dirs, empty TSDB, cleared Slurm state) unless
# FLEETHEALTH_SERVICES_KEEP_STATE=1. With --started-file, the names of the services this call really
# started are appended to FILE, so a caller (make test) can stop only what it started.
#
# Ports: Kafka 127.0.0.1:9092 (controller 9093), Prometheus 127.0.0.1:9090, slurmctld 6817, slurmd 6818.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SVC="$ROOT/.services"
KAFKA_VERSION="4.1.1"
KAFKA_LIBS="${FLEETHEALTH_KAFKA_LIBS:-${XDG_CACHE_HOME:-$HOME/.cache}/fleethealth/kafka-$KAFKA_VERSION-libs}"
KAFKA_BOOTSTRAP="127.0.0.1:9092"
PROM_URL="http://127.0.0.1:9090"
SLURM_DIR="$SVC/slurm"
SLURM_CONF_FILE="$SLURM_DIR/slurm.conf"
SLURM_HOST="$(hostname -s)"
GPU_NODES="gpu-node-[001-008]"
PY="$ROOT/.venv/bin/python"
STARTED_FILE=""

log() { printf '%s\n' "$*"; }
die() { printf 'services.sh: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }

pid_alive() { # pidfile -> 0 if it names a live process
  local f="$1" pid
  [[ -s "$f" ]] || return 1
  pid="$(tr -dc '0-9' <"$f")"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

stop_pidfile() { # name pidfile [timeout_s]
  local name="$1" f="$2" t="${3:-30}" pid i
  if ! pid_alive "$f"; then
    rm -f "$f"
    log "$name: not running"
    return 0
  fi
  pid="$(tr -dc '0-9' <"$f")"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < t * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$name: did not stop in ${t}s, sending SIGKILL to $pid"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
  fi
  rm -f "$f"
  log "$name: stopped (pid $pid)"
}

mark_started() { [[ -z "$STARTED_FILE" ]] || echo "$1" >>"$STARTED_FILE"; }

# ---------------------------------------------------------------------------------------------- deps
deps() {
  local missing=()
  [[ -x /usr/bin/prometheus ]] || missing+=(prometheus)
  [[ -x /usr/sbin/slurmctld && -x /usr/sbin/slurmd && -x /usr/bin/scontrol ]] || missing+=(slurm-wlm)
  [[ -x /usr/sbin/munged ]] || missing+=(munge)
  command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null || missing+=(maven)
  command -v curl >/dev/null || missing+=(curl)
  # tests/report renders the HTML report in headless Chromium (Debian's headless shell has --screenshot)
  command -v chromium-headless-shell >/dev/null || missing+=(chromium-headless-shell)
  if ((${#missing[@]} == 0)); then
    log "deps: prometheus, slurm-wlm, munge, java, maven, curl, chromium-headless-shell present"
    return 0
  fi
  log "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -q
  apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"
}

# --------------------------------------------------------------------------------------------- kafka
kafka_libs() {
  local stamp="$KAFKA_LIBS/.complete" want
  want="$(sha256sum "$ROOT/deploy/kafka/pom.xml" | cut -c1-16)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  log "kafka: resolving Kafka $KAFKA_VERSION jars from Maven Central into $KAFKA_LIBS"
  local t0 tmp
  t0="$(now)"
  tmp="$KAFKA_LIBS.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  (cd "$ROOT/deploy/kafka" && mvn -q -B -f pom.xml dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$tmp") >"$SVC/kafka/mvn.log" 2>&1 ||
    { tail -30 "$SVC/kafka/mvn.log" >&2; die "kafka: mvn dependency:copy-dependencies failed (log: $SVC/kafka/mvn.log)"; }
  rm -rf "$KAFKA_LIBS"
  mv "$tmp" "$KAFKA_LIBS"
  echo "$want" >"$stamp"
  log "kafka: jars ready ($(ls "$KAFKA_LIBS" | wc -l) files, $(elapsed "$t0"))"
}

# Wait (up to $1 s) until the broker answers a metadata request, then create fleethealth's topics
# (8 partitions each) if missing: with kafka-python from .venv when it is there, else with the
# Kafka admin CLI class from the jars (slower: one JVM per topic).
kafka_topics() {
  local timeout="$1" i t ok=0
  if [[ -x "$PY" ]] && "$PY" -c 'import kafka' 2>/dev/null; then
    "$PY" "$ROOT/scripts/kafka_topics.py" --bootstrap "$KAFKA_BOOTSTRAP" --timeout "$timeout"
    return
  fi
  for ((i = 0; i < timeout * 10; i++)); do
    port_open 9092 && { ok=1; break; }
    sleep 0.1
  done
  ((ok)) || return 1
  for t in fleet.telemetry.v1 fleet.incidents.v1 fleet.actions.v1 fleet.deadletter.v1; do
    java -Xmx256m -XX:TieredStopAtLevel=1 -cp "$KAFKA_LIBS/*" \
      "-Dlog4j2.configurationFile=$ROOT/deploy/kafka/log4j2.properties" \
      org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA_BOOTSTRAP" --create \
      --if-not-exists --topic "$t" --partitions 8 --replication-factor 1 >>"$SVC/kafka/topics.log" 2>&1 ||
      return 1
  done
  echo "kafka: topics ready (admin CLI)"
}

KAFKA_PENDING=0
KAFKA_T0=""
kafka_start() {
  local d="$SVC/kafka" pidf="$SVC/kafka/kafka.pid" t0
  mkdir -p "$d"
  if pid_alive "$pidf"; then
    log "kafka: already running (pid $(cat "$pidf")) on $KAFKA_BOOTSTRAP"
    kafka_topics 30 || die "kafka: running but not answering (log: $d/kafka.log)"
    return 0
  fi
  if port_open 9092 || port_open 9093; then
    # Another checkout's (or someone's) broker: use it if it answers, never stop it.
    kafka_topics 20 || die "kafka: port 9092/9093 is in use by a process that is not a working broker"
    log "kafka: reusing the broker already on $KAFKA_BOOTSTRAP (not started by this checkout; down leaves it)"
    return 0
  fi
  t0="$(now)"
  kafka_libs
  sed "s#@DATA_DIR@#$d#g" "$ROOT/deploy/kafka/server.properties" >"$d/server.properties"
  local java_opts=(-Xms256m -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError
    -XX:TieredStopAtLevel=1 -Xshare:auto -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$ROOT/deploy/kafka/log4j2.properties")
  if [[ "${FLEETHEALTH_SERVICES_KEEP_STATE:-0}" != 1 ]]; then
    rm -rf "$d/data"
  fi
  if [[ ! -f "$d/data/meta.properties" ]]; then
    local cid
    cid="$(python3 -c 'import base64, uuid; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')"
    java "${java_opts[@]}" -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool format \
      --config "$d/server.properties" --cluster-id="$cid" --ignore-formatted >"$d/format.log" 2>&1 ||
      { cat "$d/format.log" >&2; die "kafka: storage format failed"; }
    log "kafka: formatted $d/data (cluster id $cid)"
  fi
  : >"$d/kafka.log"
  setsid nohup java "${java_opts[@]}" -cp "$KAFKA_LIBS/*" kafka.Kafka "$d/server.properties" \
    >>"$d/kafka.log" 2>&1 </dev/null &
  echo $! >"$pidf"
  mark_started kafka
  KAFKA_T0="$t0"
  KAFKA_PENDING=1
}

# Wait until a broker that kafka_start launched answers a metadata request and the topics exist.
# (`up` starts the other services in between: the JVM takes the longest.)
kafka_wait() {
  ((KAFKA_PENDING)) || return 0
  KAFKA_PENDING=0
  local d="$SVC/kafka" pidf="$SVC/kafka/kafka.pid" ok=0
  kafka_topics 120 && ok=1
  if ((!ok)) || ! pid_alive "$pidf"; then
    tail -40 "$d/kafka.log" >&2
    die "kafka: did not come up (log: $d/kafka.log)"
  fi
  log "kafka: up on $KAFKA_BOOTSTRAP (pid $(cat "$pidf"), Kafka $KAFKA_VERSION, answered $(elapsed "$KAFKA_T0") after start)"
}

kafka_down() { stop_pidfile kafka "$SVC/kafka/kafka.pid" 45; }

kafka_status() {
  if pid_alive "$SVC/kafka/kafka.pid"; then
    if port_open 9092; then
      log "kafka: running (pid $(cat "$SVC/kafka/kafka.pid")) on $KAFKA_BOOTSTRAP, log $SVC/kafka/kafka.log"
    else
      log "kafka: process alive (pid $(cat "$SVC/kafka/kafka.pid")) but $KAFKA_BOOTSTRAP not answering"
      return 1
    fi
  elif port_open 9092; then
    log "kafka: something answers on $KAFKA_BOOTSTRAP (not started by this checkout)"
  else
    log "kafka: stopped"
    return 1
  fi
}

# ---------------------------------------------------------------------------------------- prometheus
prom_ready() { curl -fsS --max-time 2 "$PROM_URL/-/ready" >/dev/null 2>&1; }

prometheus_up() {
  local d="$SVC/prometheus" pidf="$SVC/prometheus/prometheus.pid" t0 i
  mkdir -p "$d"
  if pid_alive "$pidf"; then
    log "prometheus: already running (pid $(cat "$pidf")) on $PROM_URL"
    return 0
  fi
  if port_open 9090; then
    prom_ready || die "prometheus: port 9090 is in use by a process that is not a ready Prometheus"
    log "prometheus: reusing the Prometheus already on $PROM_URL (not started by this checkout; down leaves it)"
    return 0
  fi
  [[ -x /usr/bin/prometheus ]] || die "prometheus: /usr/bin/prometheus missing (run: scripts/services.sh deps)"
  t0="$(now)"
  if [[ "${FLEETHEALTH_SERVICES_KEEP_STATE:-0}" != 1 ]]; then
    rm -rf "$d/tsdb"
  fi
  : >"$d/prometheus.log"
  setsid nohup /usr/bin/prometheus \
    --config.file="$ROOT/deploy/prometheus/prometheus.yml" \
    --storage.tsdb.path="$d/tsdb" \
    --web.listen-address=127.0.0.1:9090 \
    --web.enable-lifecycle \
    >>"$d/prometheus.log" 2>&1 </dev/null &
  echo $! >"$pidf"
  mark_started prometheus
  for ((i = 0; i < 600; i++)); do
    prom_ready && break
    pid_alive "$pidf" || break
    sleep 0.1
  done
  if ! prom_ready; then
    tail -30 "$d/prometheus.log" >&2
    die "prometheus: did not become ready (log: $d/prometheus.log)"
  fi
  log "prometheus: up on $PROM_URL (pid $(cat "$pidf"), started in $(elapsed "$t0"))"
}

prometheus_down() { stop_pidfile prometheus "$SVC/prometheus/prometheus.pid" 20; }

prometheus_status() {
  if pid_alive "$SVC/prometheus/prometheus.pid"; then
    if prom_ready; then
      log "prometheus: running (pid $(cat "$SVC/prometheus/prometheus.pid")) on $PROM_URL, ready"
    else
      log "prometheus: process alive but $PROM_URL/-/ready not answering"
      return 1
    fi
  elif prom_ready; then
    log "prometheus: ready on $PROM_URL (not started by this checkout)"
  else
    log "prometheus: stopped"
    return 1
  fi
}

# --------------------------------------------------------------------------------------------- slurm
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

munge_up() {
  if munge_ok; then
    return 0
  fi
  [[ -x /usr/sbin/munged ]] || die "slurm: munged missing (run: scripts/services.sh deps)"
  mkdir -p /run/munge /var/lib/munge /var/log/munge /etc/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  chmod 0755 /run/munge
  chmod 0700 /var/log/munge
  if [[ ! -s /etc/munge/munge.key ]]; then
    log "slurm: creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null; then
      runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
    else
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged
  local i
  for ((i = 0; i < 100; i++)); do
    munge_ok && break
    sleep 0.1
  done
  munge_ok || die "slurm: munged did not start (see /var/log/munge/munged.log)"
  mkdir -p "$SLURM_DIR"
  touch "$SLURM_DIR/munged.started-by-us"
  log "slurm: munged started (pid $(cat /run/munge/munged.pid 2>/dev/null || echo ?))"
}

export SLURM_CONF="$SLURM_CONF_FILE"

slurm_write_conf() {
  mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool"
  sed -e "s#@HOST@#$SLURM_HOST#g" -e "s#@DIR@#$SLURM_DIR#g" -e "s#@NCPU@#$(nproc)#g" \
    "$ROOT/deploy/slurm/slurm.conf.in" >"$SLURM_CONF_FILE"
}

slurmctld_ok() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

node_state() { sinfo -h -N -n "$1" -o '%T' 2>/dev/null | head -1; }

slurm_up() {
  local t0 i st
  t0="$(now)"
  mkdir -p "$SLURM_DIR"
  local ctld_pid="$SLURM_DIR/slurmctld.pid" d_pid="$SLURM_DIR/slurmd.pid"
  if pid_alive "$ctld_pid" && pid_alive "$d_pid"; then
    log "slurm: already running (slurmctld pid $(cat "$ctld_pid"), slurmd pid $(cat "$d_pid")), SLURM_CONF=$SLURM_CONF_FILE"
    return 0
  fi
  [[ -x /usr/sbin/slurmctld ]] || die "slurm: slurmctld missing (run: scripts/services.sh deps)"
  munge_up
  if ! pid_alive "$ctld_pid"; then
    slurm_write_conf
    if port_open 6817; then
      slurmctld_ok || die "slurm: port 6817 is in use by a process that is not an answering slurmctld"
      log "slurm: reusing the slurmctld already on port 6817 (not started by this checkout; down leaves it)"
      log "slurm: export SLURM_CONF=$SLURM_CONF_FILE"
      return 0
    fi
    local clear=(-c)
    [[ "${FLEETHEALTH_SERVICES_KEEP_STATE:-0}" == 1 ]] && clear=()
    : >"$SLURM_DIR/slurmctld.log"
    slurmctld -f "$SLURM_CONF_FILE" "${clear[@]}" >>"$SLURM_DIR/slurmctld.out" 2>&1 ||
      { tail -20 "$SLURM_DIR/slurmctld.log" >&2; die "slurm: slurmctld failed to start"; }
    for ((i = 0; i < 300; i++)); do
      slurmctld_ok && break
      sleep 0.1
    done
    slurmctld_ok || { tail -20 "$SLURM_DIR/slurmctld.log" >&2; die "slurm: slurmctld not answering scontrol ping"; }
    mark_started slurm
  fi
  if ! pid_alive "$d_pid"; then
    port_open 6818 && die "slurm: port 6818 is in use by a slurmd this script did not start"
    : >"$SLURM_DIR/slurmd.log"
    slurmd -f "$SLURM_CONF_FILE" >>"$SLURM_DIR/slurmd.out" 2>&1 ||
      { tail -20 "$SLURM_DIR/slurmd.log" >&2; die "slurm: slurmd failed to start"; }
  fi
  # Wait until the local node has registered (idle / mixed / allocated).
  for ((i = 0; i < 300; i++)); do
    st="$(node_state "$SLURM_HOST")"
    [[ "$st" =~ ^(idle|mixed|allocated|completing)$ ]] && break
    sleep 0.1
  done
  [[ "$st" =~ ^(idle|mixed|allocated|completing)$ ]] ||
    { tail -20 "$SLURM_DIR/slurmd.log" >&2; die "slurm: local node $SLURM_HOST did not register (state '$st')"; }
  slurm_prepare_gpu_nodes
  log "slurm: up (cluster fleet, controller $SLURM_HOST:6817, nodes $SLURM_HOST + $GPU_NODES, started in $(elapsed "$t0"))"
  log "slurm: export SLURM_CONF=$SLURM_CONF_FILE"
}

# The gpu-node-* entries have no slurmd; slurmctld's pings to their NodeAddr (127.0.0.1:6818) are
# answered by the local slurmd, which takes them from `unknown` to `idle` a few seconds after start.
# RESUME is refused while a node is still UNKNOWN(+DRAIN), so wait for that before tests begin.
slurm_prepare_gpu_nodes() {
  local i states
  for ((i = 0; i < 600; i++)); do
    states="$(sinfo -h -N -n "$GPU_NODES" -o '%T' 2>/dev/null | sort -u | tr '\n' ' ')"
    [[ -n "$states" && ! "$states" =~ unk ]] && return 0
    sleep 0.1
  done
  die "slurm: $GPU_NODES still '$states' after 60s (log: $SLURM_DIR/slurmctld.log)"
}

slurm_down() {
  stop_pidfile slurmd "$SLURM_DIR/slurmd.pid" 20
  stop_pidfile slurmctld "$SLURM_DIR/slurmctld.pid" 20
  if [[ -f "$SLURM_DIR/munged.started-by-us" ]]; then
    stop_pidfile munged /run/munge/munged.pid 10
    rm -f "$SLURM_DIR/munged.started-by-us"
  fi
}

slurm_status() {
  local rc=0
  if pid_alive "$SLURM_DIR/slurmctld.pid" && slurmctld_ok; then
    log "slurm: slurmctld running (pid $(cat "$SLURM_DIR/slurmctld.pid")), SLURM_CONF=$SLURM_CONF_FILE"
  elif [[ -f "$SLURM_CONF_FILE" ]] && slurmctld_ok; then
    log "slurm: slurmctld answering (not started by this checkout), SLURM_CONF=$SLURM_CONF_FILE"
  else
    log "slurm: slurmctld stopped"
    rc=1
  fi
  if pid_alive "$SLURM_DIR/slurmd.pid"; then
    log "slurm: slurmd running (pid $(cat "$SLURM_DIR/slurmd.pid")), node $SLURM_HOST $(node_state "$SLURM_HOST")"
  elif [[ -f "$SLURM_CONF_FILE" ]] && [[ "$(node_state "$SLURM_HOST")" =~ ^(idle|mixed|allocated|completing)$ ]]; then
    log "slurm: slurmd answering (not started by this checkout), node $SLURM_HOST $(node_state "$SLURM_HOST")"
  else
    log "slurm: slurmd stopped"
    rc=1
  fi
  if munge_ok; then log "slurm: munged answering"; else log "slurm: munged not answering"; rc=1; fi
  if ((rc == 0)); then
    sinfo -N -o '  %N %T %P' 2>/dev/null | sed 's/^/  /' || true
  fi
  return "$rc"
}

# ---------------------------------------------------------------------------------------------- main
usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

main() {
  (($# >= 1)) || usage
  local cmd="$1"
  shift
  local svcs=() a
  while (($#)); do
    case "$1" in
      --started-file) STARTED_FILE="$2"; shift 2 ;;
      --started-file=*) STARTED_FILE="${1#*=}"; shift ;;
      all) svcs+=(kafka prometheus slurm); shift ;;
      kafka | prometheus | slurm) svcs+=("$1"); shift ;;
      *) die "unknown argument '$1' (want kafka, prometheus, slurm or all)" ;;
    esac
  done
  ((${#svcs[@]})) || svcs=(kafka prometheus slurm)
  mkdir -p "$SVC"
  case "$cmd" in
    up)
      local t0
      t0="$(now)"
      [[ -n "$STARTED_FILE" ]] && touch "$STARTED_FILE"
      # Kafka's JVM starts first and is waited for last, so the other services start meanwhile.
      for a in "${svcs[@]}"; do
        if [[ "$a" == kafka ]]; then kafka_start; fi
      done
      for a in "${svcs[@]}"; do
        if [[ "$a" != kafka ]]; then "${a}_up"; fi
      done
      kafka_wait
      log "services: ${svcs[*]} up ($(elapsed "$t0") in all)"
      ;;
    down)
      # Stop in reverse order.
      local i
      for ((i = ${#svcs[@]} - 1; i >= 0; i--)); do "${svcs[$i]}_down"; done
      ;;
    status)
      local rc=0
      for a in "${svcs[@]}"; do "${a}_status" || rc=1; done
      return "$rc"
      ;;
    deps) deps ;;
    env)
      echo "export SLURM_CONF=$SLURM_CONF_FILE"
      echo "export FLEETHEALTH_KAFKA=$KAFKA_BOOTSTRAP"
      echo "export FLEETHEALTH_PROMETHEUS=$PROM_URL"
      ;;
    -h | --help | help) usage ;;
    *) die "unknown command '$cmd' (want up, down, status, deps or env)" ;;
  esac
}

main "$@"
