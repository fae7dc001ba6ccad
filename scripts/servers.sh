#!/usr/bin/env bash
# Start / stop local object-store servers on 127.0.0.1 for weightbay's tests and CI.
#
#   vars=$(scripts/servers.sh start s3) && eval "$vars"    # moto (S3)
#   vars=$(scripts/servers.sh start gcs) && eval "$vars"   # fake GCS XML API (test fixture)
#   vars=$(scripts/servers.sh start azure) && eval "$vars" # Azurite (Azure Blob emulator)
#   vars=$(scripts/servers.sh start proxy) && eval "$vars" # fault-injecting proxy (tests)
#   vars=$(scripts/servers.sh start s3-disk) && eval "$vars" # s3s-fs (S3 over a directory; benchmarks)
#   scripts/servers.sh stop s3|gcs|azure|proxy|s3-disk
#   scripts/servers.sh stop-all
#
# `start` prints only `export VAR=...` lines on stdout (everything else goes to stderr), so its
# output can be eval'ed. Prefer the `vars=$(...) && eval "$vars"` form above: a plain
# `eval "$(scripts/servers.sh start s3)"` evaluates an empty string when start fails, and eval of
# nothing succeeds, so `set -e` would not stop the caller.
#
#   s3:  moto[s3] from PyPI, installed into a venv under $WEIGHTBAY_CACHE (created on first use,
#        reused afterwards). Prints AWS_ENDPOINT AWS_ALLOW_HTTP AWS_ACCESS_KEY_ID
#        AWS_SECRET_ACCESS_KEY AWS_DEFAULT_REGION AWS_BUCKET (what object_store's
#        AmazonS3Builder::from_env() reads) and WEIGHTBAY_S3_URL.
#   gcs: backends/object-store/tests/fixtures/fake_gcs_xml.py (stdlib only) with --versioning.
#        Prints GOOGLE_SERVICE_ACCOUNT GOOGLE_BUCKET (what GoogleCloudStorageBuilder::from_env()
#        reads), GCS_ENDPOINT and WEIGHTBAY_GCS_URL.
#   azure: Azurite's blob service (npm package azurite, installed under $WEIGHTBAY_CACHE/azurite
#        on first use; needs node and npm), in memory, telemetry off, with container
#        weightbay-test. Prints AZURE_STORAGE_USE_EMULATOR AZURITE_BLOB_STORAGE_URL
#        AZURE_CONTAINER_NAME (what MicrosoftAzureBuilder::from_env() reads) and WEIGHTBAY_AZURE_URL.
#   proxy: scripts/fault_proxy.py (stdlib only): a control port from which each test takes a
#        proxy of its own, in front of one of the servers above, that injects the faults it
#        asks for (503 SlowDown, 429, resets mid-body, stalls, latency, per-prefix rate limits).
#        Prints WEIGHTBAY_FAULT_PROXY (the control URL).
#   s3-disk: s3s-fs from crates.io (`cargo install`ed under $WEIGHTBAY_CACHE/s3s-fs on first use,
#        about 3 minutes on 2 cores; needs cargo), an S3 server that keeps objects as files under
#        $WEIGHTBAY_S3_DISK_DIR (default $WEIGHTBAY_RUN_DIR/s3-disk). It serves a ranged GET by
#        seeking and joins a multipart upload at disk speed, where moto reads the whole object
#        for every ranged GET and keeps everything in memory, so the benchmarks measure clients
#        on it rather than the server. It is not the tests' server: its conditional PUT is not
#        atomic, a GET ignores If-Match, and an object `a` and an object `a/b` cannot both
#        exist. Prints the same variables as s3 (one of the two at a time) and checks SigV4.
#
# Env knobs:
#   WEIGHTBAY_CACHE    cache root (default ~/.cache/weightbay); venv in $WEIGHTBAY_CACHE/venv
#   WEIGHTBAY_RUN_DIR  pid/log/env/service-account files (default $WEIGHTBAY_CACHE/run)
#   PYTHON             python used to create the venv and run the GCS fixture (default python3)
#
# Needs: bash, python3 with venv + pip (Debian: apt-get install python3-venv) reaching PyPI;
# node and npm reaching the npm registry for Azurite.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${WEIGHTBAY_CACHE:-${HOME:?HOME is unset; set WEIGHTBAY_CACHE}/.cache/weightbay}
VENV=$CACHE/venv
RUN=${WEIGHTBAY_RUN_DIR:-$CACHE/run}
PY=${PYTHON:-python3}
BUCKET=weightbay-test
HOST=127.0.0.1                     # never anything else: these servers check no credentials
FAKE_GCS_PY=$ROOT/backends/object-store/tests/fixtures/fake_gcs_xml.py
FAULT_PROXY_PY=$ROOT/scripts/fault_proxy.py
MOTO_REQS=("moto[s3]==5.2.5" "flask<4" "flask-cors<7")   # versions verified in emulators.md
AZURITE_PKG=azurite@3.35.0                                 # verified against object_store 0.14
S3S_FS_VERSION=0.14.1     # 0.15 and later need rustc 1.96
START_TIMEOUT_S=30

log() { echo "servers.sh: $*" >&2; }
die() { echo "servers.sh: ERROR: $*" >&2; exit 1; }
usage() {
  echo "usage: $0 start s3|gcs|azure|proxy|s3-disk | stop s3|gcs|azure|proxy|s3-disk | stop-all" >&2
  exit 2
}

# Is $1 alive and is its command line ours (guards against a recycled PID)?
is_ours() { # pid kind
  local pid=$1 pat
  case "$2" in s3) pat=moto_server ;; gcs) pat=fake_gcs_xml.py ;; azure) pat=azurite-blob ;; proxy) pat=fault_proxy.py ;; s3-disk) pat=s3s-fs ;; esac
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  alive "$pid" || return 1
  [ -r "/proc/$pid/cmdline" ] || return 0       # no procfs: trust kill -0
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$pat"
}

show_log() { # file
  if [ -s "$1" ]; then
    log "last lines of $1:"
    tail -n 20 "$1" >&2 || true
  fi
}

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# HTTP request to the server; exit 0 iff the status is one of the expected codes.
http_check() { # method url expected_codes(comma-separated) [authorization header]
  "$PY" - "$@" <<'EOF'
import sys, urllib.request, urllib.error
method, url, ok = sys.argv[1], sys.argv[2], {int(c) for c in sys.argv[3].split(",")}
headers = {"Authorization": sys.argv[4]} if len(sys.argv) > 4 else {}
try:
    code = urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers),
                                  timeout=10).status
except urllib.error.HTTPError as e:
    code = e.code
except OSError as e:
    sys.exit("%s %s: %s" % (method, url, e))
if code not in ok:
    sys.exit("%s %s: HTTP %d, expected %s" % (method, url, code, sorted(ok)))
EOF
}

wait_port() { # port pid timeout_s
  local i
  for ((i = 0; i < $3 * 20; i++)); do
    kill -0 "$2" 2>/dev/null || return 1
    (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

# Alive and not a zombie (an exited server whose parent has not reaped it yet counts as gone).
alive() { # pid
  kill -0 "$1" 2>/dev/null || return 1
  [ -r "/proc/$1/stat" ] || return 0
  [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" != Z ]
}

kill_pid() { # pid
  local pid=$1 i
  kill "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do       # moto takes ~2 s to exit after SIGTERM
    alive "$pid" || return 0
    sleep 0.1
  done
  log "pid $pid ignored SIGTERM for 10 s, sending SIGKILL"
  kill -9 "$pid" 2>/dev/null || true
  sleep 0.2
}

# Print the env file of an already running server and return 0, or clean up stale state.
already_running() { # kind
  local pidf=$RUN/$1.pid pid
  [ -f "$pidf" ] || return 1
  pid=$(cat "$pidf")
  if is_ours "$pid" "$1" && [ -s "$RUN/$1.env" ]; then
    log "$1 already running (pid $pid); reusing it"
    cat "$RUN/$1.env"
    return 0
  fi
  log "removing stale $1 state (pid $pid is not running)"
  rm -f "$pidf" "$RUN/$1.env"
  return 1
}

write_env() { # file VAR=value...
  local f=$1 kv
  shift
  : >"$f.tmp"
  for kv in "$@"; do printf 'export %s=%q\n' "${kv%%=*}" "${kv#*=}" >>"$f.tmp"; done
  mv "$f.tmp" "$f"
}

# What object_store's AmazonS3Builder::from_env() reads, for either S3 server.
write_s3_env() { # file url
  write_env "$1" \
    "AWS_ENDPOINT=$2" \
    AWS_ALLOW_HTTP=true \
    AWS_ACCESS_KEY_ID=test \
    AWS_SECRET_ACCESS_KEY=test \
    AWS_DEFAULT_REGION=us-east-1 \
    "AWS_BUCKET=$BUCKET" \
    "WEIGHTBAY_S3_URL=s3://$BUCKET"
}

ensure_venv() {
  command -v "$PY" >/dev/null || die "$PY not found (python3 is required)"
  mkdir -p "$CACHE"
  if command -v flock >/dev/null; then        # two concurrent starts must not both pip install
    exec 9>"$CACHE/.venv.lock"
    flock 9
    install_moto
    exec 9>&-                                  # release; the server must not inherit the lock
  else
    install_moto
  fi
}

install_moto() {
  local stamp=$VENV/.weightbay-requirements want
  want=$(printf '%s\n' "${MOTO_REQS[@]}")
  if [ -x "$VENV/bin/moto_server" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  local t0=$SECONDS
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    rm -rf "$VENV"
    log "creating venv $VENV"
    "$PY" -m venv "$VENV" >&2 ||
      { rm -rf "$VENV"; die "'$PY -m venv $VENV' failed (Debian: apt-get install python3-venv)"; }
  fi
  log "installing ${MOTO_REQS[*]} into $VENV"
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q "${MOTO_REQS[@]}" >&2 ||
    die "pip install ${MOTO_REQS[*]} failed (is PyPI reachable?)"
  [ -x "$VENV/bin/moto_server" ] || die "pip succeeded but $VENV/bin/moto_server is missing"
  echo "$want" >"$stamp"
  log "moto installed in $((SECONDS - t0)) s"
}

start_s3() {
  mkdir -p "$RUN"
  already_running s3 && return 0
  ensure_venv
  local try port pid="" logf=$RUN/s3.log
  for try in 1 2 3; do   # the probed port can be taken before moto binds it: retry
    port=$(free_port) || die "could not find a free port"
    "$VENV/bin/moto_server" -H "$HOST" -p "$port" </dev/null >"$logf" 2>&1 &
    pid=$!
    if wait_port "$port" "$pid" "$START_TIMEOUT_S"; then break; fi
    log "moto did not come up on $HOST:$port (try $try/3)"
    show_log "$logf"
    kill_pid "$pid"
    pid=""
  done
  [ -n "$pid" ] || die "moto_server failed to start; see $logf"
  echo "$pid" >"$RUN/s3.pid"
  # moto checks no signatures, but routes by the service in the Authorization scope
  local auth="AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0"
  local url=http://$HOST:$port
  if ! http_check PUT "$url/$BUCKET" 200 "$auth" || ! http_check GET "$url/$BUCKET" 200 "$auth"; then
    show_log "$logf"
    kill_pid "$pid"
    rm -f "$RUN/s3.pid"
    die "moto started on $url but creating bucket $BUCKET failed"
  fi
  write_s3_env "$RUN/s3.env" "$url"
  log "moto S3 ready at $url (pid $pid, bucket $BUCKET, log $logf)"
  cat "$RUN/s3.env"
}

start_gcs() {
  mkdir -p "$RUN"
  already_running gcs && return 0
  command -v "$PY" >/dev/null || die "$PY not found (python3 is required)"
  [ -f "$FAKE_GCS_PY" ] || die "missing test fixture $FAKE_GCS_PY"
  local portf=$RUN/gcs.port logf=$RUN/gcs.log pid i port=""
  rm -f "$portf"
  # --port 0: the OS picks a free port; the fixture writes it to --port-file once it listens
  "$PY" "$FAKE_GCS_PY" --host "$HOST" --port 0 --bucket "$BUCKET" --versioning \
    --port-file "$portf" </dev/null >"$logf" 2>&1 &
  pid=$!
  for ((i = 0; i < START_TIMEOUT_S * 20; i++)); do
    kill -0 "$pid" 2>/dev/null || { show_log "$logf"; die "fake GCS server exited during start"; }
    if [ -s "$portf" ]; then port=$(cat "$portf"); break; fi
    sleep 0.05
  done
  [ -n "$port" ] || { show_log "$logf"; kill_pid "$pid"; die "fake GCS server did not start in ${START_TIMEOUT_S} s"; }
  echo "$pid" >"$RUN/gcs.pid"
  local url=http://$HOST:$port
  if ! http_check GET "$url/" 200 || ! http_check GET "$url/$BUCKET?list-type=2" 200; then
    show_log "$logf"
    kill_pid "$pid"
    rm -f "$RUN/gcs.pid" "$portf"
    die "fake GCS server on $url does not answer"
  fi
  # object_store needs all of private_key, private_key_id and client_email (empty is fine);
  # disable_oauth sends no token; gcs_base_url points the client at the fake.
  local sa=$RUN/gcs-sa.json
  printf '{"gcs_base_url": "%s", "disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""}\n' \
    "$url" >"$sa"
  write_env "$RUN/gcs.env" \
    "GOOGLE_SERVICE_ACCOUNT=$sa" \
    "GOOGLE_BUCKET=$BUCKET" \
    "GCS_ENDPOINT=$url" \
    "WEIGHTBAY_GCS_URL=gs://$BUCKET"
  log "fake GCS (XML API test fixture) ready at $url (pid $pid, bucket $BUCKET, log $logf)"
  cat "$RUN/gcs.env"
}

install_azurite() {
  local dir=$CACHE/azurite
  if [ -x "$dir/node_modules/.bin/azurite-blob" ] && [ "$(cat "$dir/.weightbay-package" 2>/dev/null)" = "$AZURITE_PKG" ]; then
    return 0
  fi
  command -v npm >/dev/null || die "npm not found (Azurite needs node and npm)"
  mkdir -p "$dir"
  log "installing $AZURITE_PKG into $dir"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "$AZURITE_PKG" >&2) ||
    die "npm install $AZURITE_PKG failed (is the npm registry reachable?)"
  echo "$AZURITE_PKG" >"$dir/.weightbay-package"
}

# Azure's SharedKey signature, for the one request that creates the container.
create_azure_container() { # url
  "$PY" - "$1" "$BUCKET" <<'PYTHON'
import base64, email.utils, hashlib, hmac, http.client, sys
from urllib.parse import urlsplit
url, container = urlsplit(sys.argv[1]), sys.argv[2]
account = "devstoreaccount1"   # Azurite's well-known development account and key
key = base64.b64decode("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")
date, version = email.utils.formatdate(usegmt=True), "2021-08-06"
to_sign = "PUT\n" + "\n" * 11 + "x-ms-date:%s\nx-ms-version:%s\n/%s/%s/%s\nrestype:container" % (
    date, version, account, account, container)
signature = base64.b64encode(hmac.new(key, to_sign.encode(), hashlib.sha256).digest()).decode()
connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
connection.request("PUT", "/%s/%s?restype=container" % (account, container), headers={
    "x-ms-date": date, "x-ms-version": version, "Content-Length": "0",
    "Authorization": "SharedKey %s:%s" % (account, signature)})
status = connection.getresponse().status
if status not in (201, 409):
    sys.exit("creating container %s: HTTP %d" % (container, status))
PYTHON
}

start_azure() {
  mkdir -p "$RUN"
  already_running azure && return 0
  command -v "$PY" >/dev/null || die "$PY not found (python3 is required)"
  install_azurite
  local try port pid="" logf=$RUN/azure.log
  for try in 1 2 3; do   # the probed port can be taken before Azurite binds it: retry
    port=$(free_port) || die "could not find a free port"
    "$CACHE/azurite/node_modules/.bin/azurite-blob" --blobHost "$HOST" --blobPort "$port" \
      --inMemoryPersistence --disableTelemetry --skipApiVersionCheck --silent </dev/null >"$logf" 2>&1 &
    pid=$!
    if wait_port "$port" "$pid" "$START_TIMEOUT_S"; then break; fi
    log "Azurite did not come up on $HOST:$port (try $try/3)"
    show_log "$logf"
    kill_pid "$pid"
    pid=""
  done
  [ -n "$pid" ] || die "Azurite failed to start; see $logf"
  echo "$pid" >"$RUN/azure.pid"
  local url=http://$HOST:$port
  if ! create_azure_container "$url" >&2; then
    show_log "$logf"
    kill_pid "$pid"
    rm -f "$RUN/azure.pid"
    die "Azurite started on $url but creating container $BUCKET failed"
  fi
  write_env "$RUN/azure.env" \
    AZURE_STORAGE_USE_EMULATOR=true \
    "AZURITE_BLOB_STORAGE_URL=$url" \
    "AZURE_CONTAINER_NAME=$BUCKET" \
    "WEIGHTBAY_AZURE_URL=az://$BUCKET"
  log "Azurite ready at $url (pid $pid, container $BUCKET, log $logf)"
  cat "$RUN/azure.env"
}

start_proxy() {
  mkdir -p "$RUN"
  already_running proxy && return 0
  command -v "$PY" >/dev/null || die "$PY not found (python3 is required)"
  local portf=$RUN/proxy.port logf=$RUN/proxy.log pid i port=""
  rm -f "$portf"
  "$PY" "$FAULT_PROXY_PY" --port 0 --port-file "$portf" </dev/null >"$logf" 2>&1 &
  pid=$!
  for ((i = 0; i < START_TIMEOUT_S * 20; i++)); do
    kill -0 "$pid" 2>/dev/null || { show_log "$logf"; die "fault proxy exited during start"; }
    if [ -s "$portf" ]; then port=$(cat "$portf"); break; fi
    sleep 0.05
  done
  [ -n "$port" ] || { show_log "$logf"; kill_pid "$pid"; die "fault proxy did not start in ${START_TIMEOUT_S} s"; }
  echo "$pid" >"$RUN/proxy.pid"
  local url=http://$HOST:$port
  if ! http_check GET "$url/health" 200; then
    show_log "$logf"
    kill_pid "$pid"
    rm -f "$RUN/proxy.pid" "$portf"
    die "fault proxy on $url does not answer"
  fi
  write_env "$RUN/proxy.env" "WEIGHTBAY_FAULT_PROXY=$url"
  log "fault proxy ready at $url (pid $pid, log $logf)"
  cat "$RUN/proxy.env"
}

install_s3s_fs() {
  local dir=$CACHE/s3s-fs
  if [ -x "$dir/bin/s3s-fs" ] && [ "$(cat "$dir/.weightbay-version" 2>/dev/null)" = "$S3S_FS_VERSION" ]; then
    return 0
  fi
  command -v cargo >/dev/null || die "cargo not found (s3s-fs is installed from crates.io)"
  log "installing s3s-fs $S3S_FS_VERSION into $dir (cargo install, a few minutes)"
  # Its own target directory: the workspace's must not be rebuilt with another feature set.
  CARGO_TARGET_DIR=$dir/target cargo install --quiet --locked --features binary \
    --root "$dir" "s3s-fs@$S3S_FS_VERSION" >&2 || die "cargo install s3s-fs@$S3S_FS_VERSION failed"
  rm -rf "$dir/target"
  echo "$S3S_FS_VERSION" >"$dir/.weightbay-version"
}

start_s3_disk() {
  mkdir -p "$RUN"
  already_running s3-disk && return 0
  install_s3s_fs
  local data=${WEIGHTBAY_S3_DISK_DIR:-$RUN/s3-disk} try port pid="" logf=$RUN/s3-disk.log
  mkdir -p "$data/$BUCKET"            # s3s-fs keeps a bucket as a directory under its root
  for try in 1 2 3; do   # the probed port can be taken before s3s-fs binds it: retry
    port=$(free_port) || die "could not find a free port"
    "$CACHE/s3s-fs/bin/s3s-fs" --host "$HOST" --port "$port" --access-key test --secret-key test \
      "$data" </dev/null >"$logf" 2>&1 &
    pid=$!
    if wait_port "$port" "$pid" "$START_TIMEOUT_S"; then break; fi
    log "s3s-fs did not come up on $HOST:$port (try $try/3)"
    show_log "$logf"
    kill_pid "$pid"
    pid=""
  done
  [ -n "$pid" ] || die "s3s-fs failed to start; see $logf"
  echo "$pid" >"$RUN/s3-disk.pid"
  local url=http://$HOST:$port
  write_s3_env "$RUN/s3-disk.env" "$url"
  log "s3s-fs S3 ready at $url (pid $pid, bucket $BUCKET under $data, log $logf)"
  cat "$RUN/s3-disk.env"
}

stop_kind() { # kind
  local pidf=$RUN/$1.pid pid
  if [ ! -f "$pidf" ]; then
    log "$1 not running (no $pidf)"
    return 0
  fi
  pid=$(cat "$pidf")
  if is_ours "$pid" "$1"; then
    kill_pid "$pid"
    if alive "$pid"; then
      log "ERROR: could not stop $1 server (pid $pid)"
      return 1
    fi
    log "stopped $1 (pid $pid)"
  else
    log "$1 pid $pid is not running (or not ours); cleaning up its state only"
  fi
  rm -f "$pidf" "$RUN/$1.env" "$RUN/$1.env.tmp"
  [ "$1" = gcs ] && rm -f "$RUN/gcs.port" "$RUN/gcs-sa.json"
  [ "$1" = proxy ] && rm -f "$RUN/proxy.port"
  return 0
}

case "${1:-}" in
  start)
    case "${2:-}" in
      s3) start_s3 ;;
      gcs) start_gcs ;;
      azure) start_azure ;;
      proxy) start_proxy ;;
      s3-disk) start_s3_disk ;;
      *) usage ;;
    esac ;;
  stop)
    case "${2:-}" in
      s3 | gcs | azure | proxy | s3-disk) stop_kind "$2" || exit 1 ;;
      *) usage ;;
    esac ;;
  stop-all)
    rc=0
    stop_kind s3 || rc=1
    stop_kind gcs || rc=1
    stop_kind azure || rc=1
    stop_kind proxy || rc=1
    stop_kind s3-disk || rc=1
    exit $rc ;;
  *) usage ;;
esac
