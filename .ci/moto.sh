#!/usr/bin/env bash
# moto (a local AWS API emulator) for the `aws` cloud provider's integration tests.
#
#   bash .ci/moto.sh install          create .venv in the repo root and install the pinned moto
#   bash .ci/moto.sh start [PORT]     start moto_server on 127.0.0.1 (free port if none), print
#                                     MOTO_ENDPOINT=http://127.0.0.1:PORT; pid in .venv/moto.pid
#   bash .ci/moto.sh stop             stop the server started by `start`
#   bash .ci/moto.sh path             print the moto_server binary the tests should use
#
# tests/aws_moto.rs starts its own moto_server (found via $MOTO_SERVER or .venv/bin/moto_server),
# so CI only needs `install`; start/stop are for poking at the sandbox by hand.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
# 5.2.5 works with the current aws-sdk-rust; only the ec2 + route53 extras keep the venv ~140 MB
# instead of ~320 MB for moto[server]. flask/flask-cors are what moto_server itself needs.
MOTO_SPEC=("moto[ec2,route53]==5.2.5" "flask" "flask-cors")
MOTO_VERSION="5.2.5"
PIDFILE="$VENV/moto.pid"

installed() {
    [[ -x "$VENV/bin/moto_server" ]] &&
        [[ "$("$VENV/bin/python" -c 'import moto; print(moto.__version__)' 2>/dev/null)" == "$MOTO_VERSION" ]] &&
        "$VENV/bin/python" -c 'import flask, flask_cors' 2>/dev/null
}

cmd_install() {
    if installed; then
        echo "moto $MOTO_VERSION already installed in $VENV"
        return 0
    fi
    if [[ ! -x "$VENV/bin/python" ]]; then
        python3 -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install --quiet "${MOTO_SPEC[@]}"
    installed || { echo "moto install in $VENV failed" >&2; exit 1; }
    echo "moto $MOTO_VERSION installed in $VENV"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

cmd_start() {
    installed || cmd_install
    local port="${1:-$(free_port)}"
    MOTO_ENABLE_AMI_VALIDATION=true MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION=true \
        nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port" >"$VENV/moto.log" 2>&1 &
    echo $! >"$PIDFILE"
    # Wait on readiness rather than a fixed sleep: moto takes a few seconds to import.
    for _ in $(seq 1 100); do
        if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/moto-api/', timeout=1)" 2>/dev/null; then
            echo "MOTO_ENDPOINT=http://127.0.0.1:$port"
            return 0
        fi
        kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { cat "$VENV/moto.log" >&2; exit 1; }
        sleep 0.2
    done
    echo "moto_server did not answer on port $port" >&2
    exit 1
}

cmd_stop() {
    if [[ -f "$PIDFILE" ]]; then
        kill "$(cat "$PIDFILE")" 2>/dev/null || true
        rm -f "$PIDFILE"
    fi
}

case "${1:-}" in
    install) cmd_install ;;
    start) shift; cmd_start "$@" ;;
    stop) cmd_stop ;;
    path) echo "$VENV/bin/moto_server" ;;
    *) echo "usage: $0 install|start [PORT]|stop|path" >&2; exit 2 ;;
esac
