#!/usr/bin/env bash
# Runs a single-node Apache Kafka broker in KRaft mode from Maven Central jars; no Docker needed.
#   deploy/kafka/kafka.sh fetch            download the jars (once; Maven caches them)
#   deploy/kafka/kafka.sh run DIR PORT [CONTROLLER_PORT [SASL_PORT]]
#                                          format DIR (if new) and run the broker in the foreground
# With SASL_PORT, the broker also listens there with SASL_PLAINTEXT/SCRAM-SHA-512 and authorizes
# every request with the KRaft StandardAuthorizer (no ACL: no access); SIBYLLA_KAFKA_SCRAM_USERS
# names a file of "name:password" lines (mode 600) whose users are created when DIR is
# formatted; "admin" must be one of them: the super user, also used between broker and
# controller. PORT stays a PLAINTEXT listener whose anonymous clients may do nothing but fetch
# metadata (it answers the launcher's readiness probe). Loopback only; a test broker.
# SIBYLLA_KAFKA_JOIN_DELAY_MS: group.initial.rebalance.delay.ms, how long the broker holds a new
# group's first join for more members (0 here, for fast tests; Kafka's own default is 3000).
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

# The SCRAM password of a user in the SIBYLLA_KAFKA_SCRAM_USERS file.
password_of() {
  local name="$1" line
  while IFS= read -r line; do
    if [ "${line%%:*}" = "$name" ]; then printf '%s' "${line#*:}"; return 0; fi
  done < "$SIBYLLA_KAFKA_SCRAM_USERS"
  echo "kafka.sh: no user $name in $SIBYLLA_KAFKA_SCRAM_USERS" >&2
  return 1
}

# server.properties lines of the SASL listener, the controller's SASL/PLAIN and the authorizer.
sasl_properties() {
  local port="$1" controller_port="$2" sasl_port="$3" admin
  admin="$(password_of admin)"
  cat <<PROPS
listeners=PLAINTEXT://127.0.0.1:${port},SASL_PLAINTEXT://127.0.0.1:${sasl_port},CONTROLLER://127.0.0.1:${controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:${port},SASL_PLAINTEXT://127.0.0.1:${sasl_port}
listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
inter.broker.listener.name=SASL_PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="${admin}";
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="${admin}" user_admin="${admin}";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin
allow.everyone.if.no.acl.found=false
PROPS
}

run() {
  local dir="$1" port="$2" controller_port="${3:-$(( $2 + 1 ))}" sasl_port="${4:-}"
  fetch
  mkdir -p "$dir"
  local listeners scram=()
  if [ -n "$sasl_port" ]; then
    : "${SIBYLLA_KAFKA_SCRAM_USERS:?kafka.sh: SASL_PORT needs SIBYLLA_KAFKA_SCRAM_USERS}"
    listeners="$(sasl_properties "$port" "$controller_port" "$sasl_port")"
    local line
    while IFS= read -r line; do
      [ -n "$line" ] && scram+=(--add-scram "SCRAM-SHA-512=[name=${line%%:*},password=${line#*:}]")
    done < "$SIBYLLA_KAFKA_SCRAM_USERS"
  else
    listeners="listeners=PLAINTEXT://127.0.0.1:${port},CONTROLLER://127.0.0.1:${controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:${port}
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
  fi
  (umask 077; cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:${controller_port}
controller.listener.names=CONTROLLER
${listeners}
log.dirs=${dir}/data
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=${SIBYLLA_KAFKA_JOIN_DELAY_MS:-0}
auto.create.topics.enable=true
log.retention.hours=24
PROPS
  )
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
      -t "sibylla-test-cluster-0001" -c "$dir/server.properties" "${scram[@]}" >/dev/null
  fi
  exec java "${jvm[@]}" -cp "$cp" kafka.Kafka "$dir/server.properties"
}

case "${1:-}" in
  fetch) fetch ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 fetch | run DIR PORT [CONTROLLER_PORT [SASL_PORT]]" >&2; exit 2 ;;
esac
