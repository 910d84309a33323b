#!/bin/sh
# Chromium binds its DevTools port to loopback only; socat relays it on the container's
# interface so the host can reach it through the (loopback-published) port mapping.
set -e
CDP_PORT="${CDP_PORT:-9222}"
INTERNAL_PORT=$((CDP_PORT + 1))
chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage \
  --no-first-run --no-default-browser-check --disable-background-networking \
  --remote-debugging-address=127.0.0.1 --remote-debugging-port="$INTERNAL_PORT" \
  --user-data-dir=/tmp/chromium-profile about:blank &
exec socat TCP-LISTEN:"$CDP_PORT",fork,reuseaddr TCP:127.0.0.1:"$INTERNAL_PORT"
