#!/usr/bin/env bash
# curl smoke tests against a running server: healthy ping, then for each model it serves a text
# and a JSON body answered (for `bert`, the default sentiment model: positive and negative) and
# two bad inputs refused. Usage: scripts/smoke.sh [STATE_DIR]   (default .run, as `make serve` uses)
# The token is read from the server's key file and passed to curl on a file descriptor,
# so it never appears in the output or in the process list.
set -euo pipefail
cd "$(dirname "$0")/.."
state_dir="${1:-.run}"
python="${VENV_PYTHON:-.venv/bin/python}"  # not PYTHON: make install reads that as the venv's base
ctl() { "$python" -m bert_serve_server "$@" --state-dir "$state_dir"; }
url=$(ctl url)
models=$(ctl models)
token=$(ctl key)
failures=0
passed=0

call() {  # call EXPECTED_STATUS EXPECTED_FRAGMENT curl-args...
  local expected_status=$1 fragment=$2 body status
  shift 2
  body=$(mktemp)
  status=$(curl -sS -o "$body" -w '%{http_code}' -H @<(printf 'Authorization: Bearer %s\n' "$token") "$@")
  if [ "$status" = "$expected_status" ] && grep -qF -- "$fragment" "$body"; then
    passed=$((passed + 1)); echo "ok    $status $fragment"
  else
    failures=$((failures + 1)); echo "FAIL  expected $expected_status with '$fragment', got $status: $(head -c 300 "$body")"
  fi
  rm -f "$body"
}

call 200 '"status": "Healthy"' "$url/ping"
for model in $models; do
  predict=$(ctl predict-url --model "$model")
  echo "model $model: $predict"
  if [ "$model" = bert ]; then good='"label": "positive"' bad='"label": "negative"' form='"label": "positive"'
  else good='"scores"' bad='"scores"' form='"scores"'; fi
  call 200 "$good" -H 'Content-Type: text/plain' \
    --data 'An absolute delight from start to finish.' "$predict"
  call 200 "$bad" -H 'Content-Type: application/json' \
    --data '{"text": "A tedious, joyless mess."}' "$predict"
  call 200 "$form" --data-urlencode 'text=Loved it & would watch again: 10/10!' "$predict"
  call 400 '"code": "empty_text"' -H 'Content-Type: text/plain' --data '   ' "$predict"
  call 400 '"code": "invalid_json"' -H 'Content-Type: application/json' --data '{"text": ' "$predict"
done
echo "smoke: $passed passed, $failures failed"
[ "$failures" -eq 0 ]
