#!/bin/sh
# Chromium binds its DevTools port to loopback only; socat relays it on the container's
# interface so the host can reach it through the (loopback-published) port mapping.
# With PROXY_SERVER (network: egress) every request goes to the sandbox's egress proxy, loopback
# included, and the browser resolves no name itself (the proxy does, after its checks).
set -e
CDP_PORT="${CDP_PORT:-9222}"
INTERNAL_PORT=$((CDP_PORT + 1))
if [ -n "${PROXY_SERVER:-}" ]; then
  set -- --proxy-server="http://$PROXY_SERVER" --proxy-bypass-list="<-loopback>" \
    --host-resolver-rules="MAP * ~NOTFOUND , EXCLUDE ${PROXY_SERVER%:*}"
fi
chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage \
  --no-first-run --no-default-browser-check --disable-background-networking \
  --remote-debugging-address=127.0.0.1 --remote-debugging-port="$INTERNAL_PORT" \
  --user-data-dir=/tmp/chromium-profile "$@" about:blank &
exec socat TCP-LISTEN:"$CDP_PORT",fork,reuseaddr TCP:127.0.0.1:"$INTERNAL_PORT"
