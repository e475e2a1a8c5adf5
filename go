#!/usr/bin/env bash
# kafkatap's one entry point on a fresh machine: installs what is missing
# (Debian packages, a project virtualenv, the Kafka jars), then runs the demo,
# the tests or a benchmark. Idempotent: a second run installs nothing.
set -euo pipefail
CALLER_DIR=$PWD  # `./go kafkatap ARGS` reads and writes paths relative to where it was called from
cd "$(dirname "$(readlink -f "$0")")"

VENV=.venv
PY=${PYTHON:-python3}
# command -> Debian package providing it
DEBIAN_TOOLS="java:default-jre-headless javac:default-jdk-headless mvn:maven cc:gcc tshark:tshark kcat:kcat iptables:iptables ip:iproute2 haproxy:haproxy chromium:chromium conntrack:conntrack ps:procps"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

usage() {
  cat <<USAGE
usage: ./go COMMAND [ARGS...]

  demo [ARGS]    install what is missing, then run 'kafkatap demo' (local Kafka + proxy + traffic + Spark report)
  test [ARGS]    install what is missing, then run the whole test suite (pytest ARGS pass through)
  quick-test     the tests that need no broker, Spark or root (about 3,000 tests, three to five minutes)
  bench NAME     run bench/NAME.py (proxy_overhead, relay_ab, hostile, recording_cost, workers, parse, analytics_scale)
  setup          only install (Debian packages, .venv, Kafka jars, Spark class archive)
  kafkatap ARGS  run the kafkatap CLI from the project venv
USAGE
}

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; exit 1; fi
}

system_packages() {
  local missing="" entry tool pkg
  for entry in $DEBIAN_TOOLS; do
    tool=${entry%%:*}; pkg=${entry#*:}
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing="$missing $pkg"
  done
  "$PY" -c "import ensurepip, venv" >/dev/null 2>&1 || missing="$missing python3-venv"
  if [ -n "$missing" ]; then
    say "installing Debian packages:$missing"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
}

python_env() {
  local stamp=$VENV/.kafkatap-installed
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PY" -m venv "$VENV"
  fi
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
    say "installing kafkatap and its Python dependencies into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[dev]"
    touch "$stamp"
  fi
}

kafka_jars() {
  "$VENV/bin/python" -m harness.jars
  # Apache Kafka's JSON message specs (kafka-clients sources jars): the codec generator's input
  "$VENV/bin/python" -m harness.jars --specs
  # kafka-streams-examples (WordCountDemo) and its dependencies: the Kafka Streams app test
  "$VENV/bin/python" -m harness.jars --streams
}

spark_class_archive() {
  # a CDS archive of the classes an analysis loads: saves seconds of JVM warm-up on every `kafkatap analyze`
  "$VENV/bin/python" -m analytics.class_archive
}

setup() { system_packages; python_env; kafka_jars; spark_class_archive; }

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  demo)       setup; exec "$VENV/bin/kafkatap" demo "$@" ;;
  test)       setup; exec "$VENV/bin/python" -m pytest "$@" ;;
  quick-test) system_packages; python_env; exec "$VENV/bin/python" -m pytest -m "not kafka and not netns and not spark" "$@" ;;
  bench)      setup; name=${1:?bench NAME}; shift; exec "$VENV/bin/python" "bench/$name.py" "$@" ;;
  setup)      setup ;;
  kafkatap)   python_env; cli="$PWD/$VENV/bin/kafkatap"; cd "$CALLER_DIR"; exec "$cli" "$@" ;;
  ""|-h|--help|help) usage ;;
  *) echo "unknown command: $cmd" >&2; usage >&2; exit 2 ;;
esac
