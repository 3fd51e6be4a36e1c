#!/bin/bash
# callgrind-measure.sh BIN LOOPS CHUNKS OUTDIR: one saturated round of each
# side, the server and the forwarder under callgrind (see PROFILING.md);
# prints each one's instruction total. OUTDIR is emptied first.
set -u
bin=$1 loops=$2 chunks=$3 out=$4
wrap="$(realpath "$(dirname "$0")")/callgrind-wrap.sh"
rm -rf "$out"; mkdir -p "$out"
CG_DIR=$out RUNLOOP_BENCH_WRAP="$wrap" "$bin" bench --loops "$loops" --chunks "$chunks" \
  --duration 0 --rounds 1 --pace 0 --json > "$out/bench.json" 2>"$out/bench.err"
for p in $(cat "$out/pids"); do kill -TERM "$p" 2>/dev/null; done
for p in $(cat "$out/pids"); do while kill -0 "$p" 2>/dev/null; do sleep 0.2; done; done
for f in "$out"/relay.* "$out"/fwd.*; do
  total=$(grep -m1 '^summary:\|^totals:' "$f" | awk '{print $2}')
  echo "$(basename "$f" | cut -d. -f1) $total"
done
