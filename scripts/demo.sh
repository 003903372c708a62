#!/usr/bin/env bash
# The main job, end to end, on a fresh machine: install contemplation, start the daemon, open a
# conversation, send a message and watch a real model's reply stream in.
# The model: Ollama when one answers at $OLLAMA_HOST (model $DEMO_MODEL, default: the first one
# it has), else the embedded llama.cpp backend with SmolLM2-135M (no server needed), which is
# installed only then.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --main
. .venv/bin/activate

# The demo's home stays when it ends, in a place of its own (the tail command it prints works
# afterwards, and a second run adds to it): $XDG_DATA_HOME/contemplation-demo, unless
# CONTEMPLATION_HOME names another. Its scratch files (the daemon's log, Ollama's model list)
# are made with mktemp and removed when it ends, however it ends.
scratch=$(mktemp -d)
daemon=
cleanup() {
  if [ -n "$daemon" ]; then kill -TERM "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; fi
  rm -rf "$scratch"
}
trap cleanup EXIT
own=${CONTEMPLATION_HOME:+yes}  # the user's: used, never offered for removal
export CONTEMPLATION_HOME=${CONTEMPLATION_HOME:-${XDG_DATA_HOME:-$HOME/.local/share}/contemplation-demo}
host=$(python -c 'from contemplation.backends.ollama import parse_ollama_host as p; import os; print(p(os.environ.get("OLLAMA_HOST"))[0])')
backend=local
model=${DEMO_MODEL:-}
if curl -fsS --max-time 2 "$host/api/tags" >"$scratch/tags.json" 2>/dev/null; then
  first=$(python -c 'import json, sys; m=json.load(open(sys.argv[1]))["models"]; print(m[0]["name"] if m else "")' "$scratch/tags.json")
  if [ -n "${model:-$first}" ]; then backend=ollama; model=${model:-$first}; fi
fi
if [ "$backend" = local ]; then
  model=smollm2
  bash scripts/setup.sh --local
fi
echo "== home: $CONTEMPLATION_HOME   backend: $backend   model: $model"
[ -n "$own" ] || echo "   (the demo's own, kept when it ends; CONTEMPLATION_HOME=... picks another)"

contemplation run --no-dashboard 2>"$scratch/daemon.log" &
daemon=$!
for _ in $(seq 100); do contemplation status --json 2>/dev/null | grep -q '"daemon_running": true' && break; sleep 0.1; done

id=$(contemplation new "Folder queues" --backend "$backend" --model "$model")
q=$(printf %q "$CONTEMPLATION_HOME")  # as a shell reads it back: the commands below can be pasted
echo "== conversation $id  (follow it with: CONTEMPLATION_HOME=$q contemplation tail -f $id)"
contemplation send "$id" "In two sentences: why is a folder of plain-text files a good queue for talking to a local model?" --wait --timeout 900
echo
contemplation status "$id"
echo "== kept: $CONTEMPLATION_HOME/active/$id/messages.log"
echo "   read it again: CONTEMPLATION_HOME=$q contemplation tail $id"
[ -n "$own" ] || echo "   remove the demo's home when done: rm -rf $q"
