#!/usr/bin/env bash
# `runc run` of a run's own bundle by hand, timed to the agent's listen:
# the floor an oci start compares with (PROFILING.md, "Where a start
# goes"). As root, with the tools of a container host.
#
#   runc-by-hand.sh RUNLOOP LAYOUT [runc|runsc] [RUNS]
#
# A server (as starts.sh runs it) makes one run of the layout's demo
# agent; its bundle (config.json) and the overlay's lower directory are
# copied while it lives. Then RUNS times (default 20): a disk, an overlay
# and a network namespace made as the server makes them (mkfs.ext4 and
# mount, overlay, ip netns), the config pointed at them, and the time from
# `runc run` to the agent accepting TCP in the namespace (a poller inside
# it, started first, dials every 0.2 ms); then the container and all it
# had are removed. Prints the median and the 90th percentile.
set -euo pipefail
binary=$(realpath "${1:?usage: runc-by-hand.sh RUNLOOP LAYOUT [runc|runsc] [RUNS]}")
layout=$(realpath "${2:?usage: runc-by-hand.sh RUNLOOP LAYOUT [runc|runsc] [RUNS]}")
runtime=${3:-runc}
runs=${4:-20}
work=$(mktemp -d)
chmod 755 "$work"
digest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]+"/index.json"))["manifests"][0]["digest"])' "$layout")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$binary" serve --listen "127.0.0.1:$port" --store "$work/store" --oci-runtime "$runtime" \
    --agent "agents/demo=oci:$layout" >"$work/url" 2>"$work/serve.log" &
server=$!
cleanup() {
    kill $server 2>/dev/null || true
    wait $server 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 600); do [ -s "$work/url" ] && break; sleep 0.1; done
url=$(head -1 "$work/url")
# One run, its bundle copied while it lives.
"$binary" bench --starts 1 --warmups 0 --url "$url" --image "agents/demo@$digest" \
    --memory 256M --disk 64M >/dev/null &
bench=$!
for _ in $(seq 3000); do
    config=$(ls "$work"/store/runs/*/config.json 2>/dev/null | head -1 || true)
    [ -n "$config" ] && grep -q overlay <(grep "$(dirname "$config")/rootfs" /proc/self/mountinfo) && break
    sleep 0.01
done
run=$(dirname "$config")
cp "$config" "$work/config.json"
lower=$(grep "$run/rootfs" /proc/self/mountinfo | grep -o 'lowerdir=[^,]*' | cut -d= -f2)
wait $bench
kill -TERM $server; wait $server || true
key=$(basename "$run")
python3 - "$work" "$run" "$key" "$lower" "$runtime" "$runs" <<'EOF'
import json, os, socket, statistics, subprocess, sys, time
work, old_run, old_key, lower, runtime, runs = sys.argv[1:]
template = open(f"{work}/config.json").read()
port = 8080
for pair in json.loads(template)["process"]["env"]:
    if pair.startswith("PORT="):
        port = int(pair[5:])
uid = json.loads(template)["linux"].get("uidMappings", [{"hostID": 0}])[0]["hostID"]
def sh(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
took = []
for n in range(int(runs)):
    key = f"byhand{n:06d}"
    run = f"{work}/runs/{key}"
    os.makedirs(f"{run}/disk")
    os.chmod(f"{work}/runs", 0o755)
    os.chown(run, 0, uid); os.chmod(run, 0o710)
    sh("truncate", "-s", "64M", f"{run}/disk.img")
    sh("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "root_owner=0:0", f"{run}/disk.img")
    sh("mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", f"{run}/disk.img", f"{run}/disk")
    for name, mode, owned in (("upper", 0o755, True), ("work", 0o700, False), ("tmp", 0o1777, True)):
        os.mkdir(f"{run}/disk/{name}", mode)
        if owned:
            os.chown(f"{run}/disk/{name}", uid, uid)
        os.chmod(f"{run}/disk/{name}", mode)
    os.mkdir(f"{run}/rootfs")
    sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={run}/disk/upper,workdir={run}/disk/work", f"{run}/rootfs")
    netns = f"runloop-{key}"
    sh("ip", "netns", "add", netns)
    sh("ip", "-n", netns, "link", "set", "lo", "up")
    config = template.replace(old_run, run).replace(f"runloop-{old_key}", netns).replace(old_key, key)
    open(f"{run}/config.json", "w").write(config)
    # The poller, inside the namespace, waits for a line to start.
    poller = subprocess.Popen(["ip", "netns", "exec", netns, "python3", "-c", f"""
import socket, sys, time
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
while True:
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", {port})); break
    except OSError:
        s.close(); time.sleep(0.0002)
print(time.monotonic_ns(), flush=True)
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert poller.stdout.readline().strip() == "ready"
    flags = ["--network=host", "--oci-seccomp", "--overlay2=none"] if runtime == "runsc" else []
    keep = ["--keep", "--no-new-keyring"] if runtime == "runc" else []
    poller.stdin.write("go\n"); poller.stdin.flush()
    began = time.monotonic_ns()
    container = subprocess.Popen([runtime, *flags, "run", *keep, "--bundle", run, f"runloop-{key}"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    listened = int(poller.stdout.readline())
    took.append((listened - began) / 1e6)
    subprocess.run([runtime, "kill", f"runloop-{key}", "KILL"], stderr=subprocess.DEVNULL)
    container.wait()
    subprocess.run([runtime, "delete", "--force", f"runloop-{key}"], stderr=subprocess.DEVNULL)
    poller.wait()
    sh("umount", f"{run}/rootfs")
    sh("umount", f"{run}/disk")
    sh("ip", "netns", "del", netns)
    subprocess.run(["rm", "-rf", run])
took.sort()
print(f"{runtime} run by hand → the agent accepts TCP, {runs} runs: p50 {statistics.median(took):.1f} ms, "
      f"p90 {took[int(0.9 * (len(took) - 1) + 0.5)]:.1f} ms (min {took[0]:.1f}, max {took[-1]:.1f})")
EOF
