#!/usr/bin/env bash
# The demo agent as an OCI image layout, for the start profile: a runloop
# binary (stripped) and the shared libraries ldd lists, running
# `runloop agent demo` — the image the container tests build, made here
# with umoci (apt-get install umoci binutils).
#
#   demo-image.sh RUNLOOP LAYOUT      e.g. target/release/runloop /tmp/demo
#
# Prints the layout's manifest digest (what a caller asks for as
# NAME@DIGEST).
set -euo pipefail
binary=${1:?usage: demo-image.sh RUNLOOP LAYOUT}
layout=${2:?usage: demo-image.sh RUNLOOP LAYOUT}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$layout"
umoci init --layout "$layout"
umoci new --image "$layout:demo"
umoci unpack --rootless --image "$layout:demo" "$work/bundle" >/dev/null
root=$work/bundle/rootfs
strip -o "$root/runloop" "$binary"
for library in $(ldd "$binary" | grep -o '/[^ ]*'); do
    mkdir -p "$root$(dirname "$library")"
    cp -L "$library" "$root$library"
done
umoci repack --image "$layout:demo" "$work/bundle"
umoci config --image "$layout:demo" --config.entrypoint /runloop \
    --config.cmd agent --config.cmd demo --config.env PATH=/
# The manifest the index names (umoci keeps one per tag; there is one tag).
python3 - "$layout" <<'EOF'
import json, sys
index = json.load(open(f"{sys.argv[1]}/index.json"))
print(index["manifests"][-1]["digest"])
EOF
