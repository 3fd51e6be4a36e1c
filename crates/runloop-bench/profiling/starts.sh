#!/usr/bin/env bash
# The start profile (PROFILING.md, "Where a start goes"): one server with
# an exec: entry and an oci: entry of the same demo agent, 20 starts of
# each from outside over the protocol (`runloop bench --starts`, two
# warm-ups first), the program spawned by hand beside them, and the
# median of every step of a start from the server's own debug log.
# As root (containers), on a built runloop and a layout from
# demo-image.sh:
#
#   starts.sh RUNLOOP LAYOUT [runc|runsc] [SERVE-ARGS…]
#
# e.g. INTERVAL=1 starts.sh target/release/runloop /tmp/demo runc --warm 4 \
#          --warm-memory 256M --warm-disk 64M
# (INTERVAL: seconds between runs, for a warm pool to refill.)
set -euo pipefail
binary=$(realpath "${1:?usage: starts.sh RUNLOOP LAYOUT [runc|runsc] [SERVE-ARGS…]}")
layout=$(realpath "${2:?usage: starts.sh RUNLOOP LAYOUT [runc|runsc] [SERVE-ARGS…]}")
runtime=${3:-runc}
shift $(($# < 3 ? $# : 3))
runs=${RUNS:-20}
work=$(mktemp -d)
# The containers' ids (a user namespace) must reach the store through it.
chmod 755 "$work"
digest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]+"/index.json"))["manifests"][0]["digest"])' "$layout")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
RUST_LOG=${RUST_LOG:-info,runloop_oci=debug,runloop_runtime=debug} \
    "$binary" serve --listen "127.0.0.1:$port" --store "$work/store" \
    --oci-runtime "$runtime" \
    --agent "demo=exec:$binary agent demo" --agent "agents/demo=oci:$layout" \
    "$@" >"$work/url" 2>"$work/serve.log" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 600); do [ -s "$work/url" ] && break; sleep 0.1; done
url=$(head -1 "$work/url")
[ -n "$url" ] || { cat "$work/serve.log" >&2; exit 1; }
echo "== exec ($runs runs)"
"$binary" bench --starts "$runs" --url "$url" --image demo --disk 0 \
    --by-hand "$binary agent demo"
echo "== oci, $runtime ($runs runs)"
"$binary" bench --starts "$runs" --url "$url" --image "agents/demo@$digest" \
    --memory 256M --disk 64M ${INTERVAL:+--interval "$INTERVAL"}
kill -TERM $server; wait $server || true
echo "== the server's steps (medians of every start, warm-ups included)"
python3 - "$work/serve.log" <<'EOF'
import re, statistics, sys
starts = {}
for line in open(sys.argv[1], errors="replace"):
    if "start steps" not in line:
        continue
    kind = "oci" if "runloop_oci" in line else "exec"
    steps = re.search(r"steps=(.*?); total ([0-9.]+) ms", line)
    if not steps:
        continue
    figures = starts.setdefault(kind, {})
    for step in steps.group(1).split(", "):
        name, took, _ = step.rsplit(" ", 2)
        figures.setdefault(name, []).append(float(took))
    figures.setdefault("total", []).append(float(steps.group(2)))
for kind, figures in starts.items():
    said = ", ".join(f"{name} {statistics.median(v):.1f}" for name, v in figures.items())
    print(f"{kind} ({len(figures['total'])} starts), ms: {said}")
EOF
