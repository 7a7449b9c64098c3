#!/usr/bin/env bash
# ctest monitoring.rules: conf/prometheus's rules parse (promtool check rules), pass their unit
# tests (promtool test rules tessera-rules.test.yml) and the example Prometheus configuration
# that loads them is valid (promtool check config).
#   check_rules.sh PROMTOOL CONF_PROMETHEUS_DIR
# A missing promtool fails the test (it is in scripts/deps: Debian's prometheus package).
set -euo pipefail
PROMTOOL=${1:?usage: check_rules.sh PROMTOOL CONF_PROMETHEUS_DIR}
DIR=${2:?usage: check_rules.sh PROMTOOL CONF_PROMETHEUS_DIR}
if [ ! -x "$PROMTOOL" ]; then
  echo "check_rules: no promtool at '$PROMTOOL': install Debian's prometheus package (scripts/deps)" >&2
  exit 1
fi
cd "$DIR"
"$PROMTOOL" check rules tessera-rules.yml
"$PROMTOOL" test rules tessera-rules.test.yml
"$PROMTOOL" check config prometheus.yml
