#!/bin/sh
# The image's entry point: `specialists <role> [args]`, with PORT honoured.
#
# Cloud Run (like most container platforms) tells a container the port to listen on in PORT. The
# service names its ports per role: SPECIALISTS_EDGE_PORT for `serve`, SPECIALISTS_WORKER_PORT for
# `worker`, SPECIALISTS_CONSOLE_PORT for `console`. PORT becomes the port of the role this container
# runs, unless that role's own setting is set. Only the role's own port: `serve`'s worker child keeps
# SPECIALISTS_WORKER_PORT (and its console child SPECIALISTS_CONSOLE_PORT), so on one machine the edge
# and its children never ask for the same port.
set -eu

if [ -n "${PORT:-}" ]; then
    case "${1:-}" in
        serve) export SPECIALISTS_EDGE_PORT="${SPECIALISTS_EDGE_PORT:-$PORT}" ;;
        worker) export SPECIALISTS_WORKER_PORT="${SPECIALISTS_WORKER_PORT:-$PORT}" ;;
        console) export SPECIALISTS_CONSOLE_PORT="${SPECIALISTS_CONSOLE_PORT:-$PORT}" ;;
    esac
fi

# exec: the service is the container's main process and gets its SIGTERM directly.
exec specialists "$@"
