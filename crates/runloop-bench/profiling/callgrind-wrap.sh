#!/bin/sh
# RUNLOOP_BENCH_WRAP for callgrind (PROFILING.md): $1 is the binary, $2 serve or __forward.
# valgrind runs in the background, so the bench's SIGKILL hits this shell
# and not it; callgrind-measure.sh ends it with SIGTERM, and callgrind writes its file.
case "$2" in serve) side=relay ;; __forward) side=fwd ;; *) side=other ;; esac
valgrind --tool=callgrind --callgrind-out-file="$CG_DIR/$side.%p" "$@" 2>>"$CG_DIR/valgrind.log" &
echo $! >> "$CG_DIR/pids"
wait
