#!/usr/bin/env bash
# Runs a single-node Apache Kafka broker in KRaft mode from Maven Central jars; no Docker needed.
#   deploy/kafka/kafka.sh fetch            download the jars (once; Maven caches them)
#   deploy/kafka/kafka.sh run DIR PORT     format DIR (if new) and run the broker in the foreground
# Java 17+ and Maven must be on PATH.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
libs="$here/target/libs"

fetch() {
  if [ ! -f "$libs/.complete" ]; then
    mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies
    touch "$libs/.complete"
  fi
}

run() {
  local dir="$1" port="$2" controller_port="${3:-$(( $2 + 1 ))}"
  fetch
  mkdir -p "$dir"
  cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:${controller_port}
listeners=PLAINTEXT://127.0.0.1:${port},CONTROLLER://127.0.0.1:${controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:${port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=${dir}/data
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=24
PROPS
  cat > "$dir/log4j2.properties" <<PROPS
status = error
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRefs = stdout
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka.server.KafkaRaftServer
logger.kafka.level = INFO
PROPS
  local cp="$libs/*"
  local jvm=(-Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true
             "-Dlog4j2.configurationFile=$dir/log4j2.properties")
  if [ ! -f "$dir/data/meta.properties" ]; then
    java "${jvm[@]}" -cp "$cp" kafka.tools.StorageTool format \
      -t "sibylla-test-cluster-0001" -c "$dir/server.properties" >/dev/null
  fi
  exec java "${jvm[@]}" -cp "$cp" kafka.Kafka "$dir/server.properties"
}

case "${1:-}" in
  fetch) fetch ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 fetch | run DIR PORT [CONTROLLER_PORT]" >&2; exit 2 ;;
esac
