#!/usr/bin/env bash
# Builds the fuzz targets of fuzz/ and runs each for SECONDS (default 60)
# with libFuzzer, from its seed corpus (fuzz/corpus/TARGET). Fails if any
# target crashes (a panic, a failed property), hangs (one input running
# longer than FUZZ_TIMEOUT seconds, default 10) or exceeds FUZZ_RSS_MB
# (default 2048) of memory. Prints executions, peak RSS and the result per
# target; findings are left in target/fuzz-runs/TARGET/ (crash-*,
# timeout-*, oom-*, and slow-unit-* inputs that are slow again when run
# alone: reproduce with `fuzz/target/x86_64-unknown-linux-gnu/
# release/TARGET FILE`).
#
#   scripts/fuzz.sh [SECONDS]
#   FUZZ_TARGETS="mux_frames merge" scripts/fuzz.sh 3600
#   FUZZ_BUDGET=cpu scripts/fuzz.sh 3600
#
# FUZZ_BUDGET=cpu counts SECONDS as the fuzzer's own CPU time (user plus
# system, read from /proc) instead of wall time, so that a long run on a
# machine that is busy with other work still gets its whole time: the
# fuzzer is interrupted (SIGINT, after which libFuzzer prints its final
# stats) once its CPU time reaches SECONDS.
#
# Stable toolchain: cargo-fuzz with `--sanitizer none` passes only stable
# rustc flags (sanitizer coverage through -Cpasses/-Cllvm-args); it is
# installed at a pinned version into target/fuzz-tools (or $FUZZ_TOOLS).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/env.sh

seconds=${1:-60}
budget=${FUZZ_BUDGET:-wall}
case $budget in wall | cpu) ;; *) echo "FUZZ_BUDGET must be wall or cpu, not '$budget'" >&2; exit 2 ;; esac
targets=(${FUZZ_TARGETS:-mux_frames nri_messages merge adjust shim_config adjuster_config})
timeout=${FUZZ_TIMEOUT:-10}
rss_mb=${FUZZ_RSS_MB:-2048}
cargo_fuzz_version=0.13.2
tools=${FUZZ_TOOLS:-$PWD/target/fuzz-tools}
runs=$PWD/target/fuzz-runs

# libfuzzer-sys builds libFuzzer (C++); nri-shim links libseccomp.
nri_need_packages g++ pkg-config libseccomp-dev
if ! "$tools/bin/cargo-fuzz" --version 2>/dev/null | grep -qx "cargo-fuzz $cargo_fuzz_version"; then
    cargo install --locked --quiet "cargo-fuzz@$cargo_fuzz_version" --root "$tools"
fi
# cargo-fuzz has no --locked: check that fuzz/Cargo.lock needs no change.
nri_patch_crates
cargo metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml >/dev/null
# Debug assertions: integer overflows are findings too.
mkdir -p "$runs"
if ! "$tools/bin/cargo-fuzz" fuzz build --sanitizer none --debug-assertions >"$runs/build.log" 2>&1; then
    tail -40 "$runs/build.log" >&2
    echo "building the fuzz targets failed (log: $runs/build.log)" >&2
    exit 1
fi
bin=fuzz/target/x86_64-unknown-linux-gnu/release

# Longest input per target: room for many frames, a request and several
# responses, a spec and an adjustment; configs stay short.
max_len() {
    case $1 in
        mux_frames | merge | adjust) echo 65536 ;;
        nri_messages) echo 16384 ;;
        *) echo 8192 ;;
    esac
}

# User plus system CPU time of a process, in clock ticks (fields 14 and
# 15 of /proc/PID/stat, counted after the command name's closing paren).
ticks=$(getconf CLK_TCK)
cpu_ticks() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
    stat=${stat##*) }
    set -- $stat
    echo $((${12} + ${13}))
}

# recheck_slow_units TARGET WORK: libFuzzer writes an input that took over
# 10 s (-report_slow_units) as slow-unit-* without failing, and a stall of
# the whole machine (seen: 247 s, in two targets at the same second, for
# inputs that run in 1 to 3 ms) makes one too. Each is run again alone
# under the hang limit: slow again is a finding; one that now passes is
# moved to WORK/slow-once-* and not counted. Prints how many were moved.
recheck_slow_units() {
    local t=$1 work=$2 f moved=0
    for f in "$work"/artifacts/slow-unit-*; do
        [ -e "$f" ] || continue
        if "$bin/$t" -timeout="$timeout" -rss_limit_mb="$rss_mb" "$f" >>"$work/slow-recheck.log" 2>&1; then
            mv "$f" "$work/slow-once-${f##*/slow-unit-}"
            moved=$((moved + 1))
        fi
    done
    echo "$moved"
}

failed=0
summary=()
for t in "${targets[@]}"; do
    [ -x "$bin/$t" ] || { echo "fuzz target $t was not built" >&2; exit 1; }
    work=$runs/$t
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/artifacts"
    log=$work/log
    echo "== fuzz $t for ${seconds}s" >&2
    set +e
    # New inputs go to the first corpus directory (a scratch copy); the
    # seeds in the repository are only read. Under a CPU budget the wall
    # limit is only a backstop.
    wall_limit=$seconds
    [ "$budget" = cpu ] && wall_limit=$((seconds * 20))
    start=$(date +%s)
    "$bin/$t" -max_total_time="$wall_limit" -timeout="$timeout" -rss_limit_mb="$rss_mb" \
        -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
        "$work/corpus" "fuzz/corpus/$t" >"$log" 2>&1 &
    pid=$!
    interrupted=0
    cpu=
    if [ "$budget" = cpu ]; then
        while kill -0 "$pid" 2>/dev/null; do
            used=$(cpu_ticks "$pid")
            [ "$used" -gt 0 ] && cpu=$((used / ticks))
            if [ "$used" -ge $((seconds * ticks)) ]; then
                interrupted=1
                kill -INT "$pid"
                break
            fi
            sleep 2
        done
    fi
    wait "$pid"
    rc=$?
    set -e
    # libFuzzer exits 72 when interrupted: that is our own stop here.
    [ "$interrupted" = 1 ] && [ "$rc" -eq 72 ] && rc=0
    secs=$(($(date +%s) - start))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
    slow_once=$(recheck_slow_units "$t" "$work")
    findings=$(find "$work/artifacts" -type f | wc -l)
    if [ "$rc" -eq 0 ] && [ "$findings" -eq 0 ]; then
        result=ok
    else
        result="FAILED (exit $rc, $findings finding(s) in $work/artifacts)"
        failed=1
        grep -E -A30 '^(thread .* panicked|==[0-9]+== ERROR|ALARM|SUMMARY)' "$log" | head -60 >&2 || tail -40 "$log" >&2
    fi
    [ "$slow_once" -gt 0 ] && result="$result ($slow_once slow unit(s) fast when run again, not counted: $work/slow-once-*)"
    secs="$secs s"
    [ "$budget" = cpu ] && secs="$secs wall, ${cpu:-?} s CPU"
    summary+=("$(printf '%-16s %10s execs in %s, peak RSS %5s MB, corpus %4s inputs: %s' \
        "$t" "${execs:-?}" "$secs" "${rss:-?}" "$(find "$work/corpus" "fuzz/corpus/$t" -type f | wc -l)" "$result")")
done
echo "== fuzz summary (${seconds}s of $budget time per target, timeout ${timeout}s, RSS limit ${rss_mb} MB)"
printf '%s\n' "${summary[@]}"
exit "$failed"
