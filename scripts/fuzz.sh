#!/usr/bin/env bash
# Builds the fuzz targets of fuzz/ and runs each for SECONDS (default 60)
# with libFuzzer, from its seed corpus (fuzz/corpus/TARGET). Fails if any
# target crashes (a panic, a failed property), hangs (one input running
# longer than FUZZ_TIMEOUT seconds, default 10) or exceeds FUZZ_RSS_MB
# (default 2048) of memory. Prints executions, peak RSS and the result per
# target; findings are left in target/fuzz-runs/TARGET/ (crash-*,
# timeout-*, oom-*: reproduce with `fuzz/target/x86_64-unknown-linux-gnu/
# release/TARGET FILE`).
#
#   scripts/fuzz.sh [SECONDS]
#   FUZZ_TARGETS="mux_frames merge" scripts/fuzz.sh 3600
#
# Stable toolchain: cargo-fuzz with `--sanitizer none` passes only stable
# rustc flags (sanitizer coverage through -Cpasses/-Cllvm-args); it is
# installed at a pinned version into target/fuzz-tools (or $FUZZ_TOOLS).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/env.sh

seconds=${1:-60}
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
    # seeds in the repository are only read.
    "$bin/$t" -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb="$rss_mb" \
        -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
        "$work/corpus" "fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    set -e
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
    secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    findings=$(find "$work/artifacts" -type f | wc -l)
    if [ "$rc" -eq 0 ] && [ "$findings" -eq 0 ]; then
        result=ok
    else
        result="FAILED (exit $rc, $findings finding(s) in $work/artifacts)"
        failed=1
        grep -E -A30 '^(thread .* panicked|==[0-9]+== ERROR|ALARM|SUMMARY)' "$log" | head -60 >&2 || tail -40 "$log" >&2
    fi
    summary+=("$(printf '%-16s %10s execs in %5ss, peak RSS %5s MB, corpus %4s inputs: %s' \
        "$t" "${execs:-?}" "${secs:-?}" "${rss:-?}" "$(find "$work/corpus" "fuzz/corpus/$t" -type f | wc -l)" "$result")")
done
echo "== fuzz summary (${seconds}s per target, timeout ${timeout}s, RSS limit ${rss_mb} MB)"
printf '%s\n' "${summary[@]}"
exit "$failed"
