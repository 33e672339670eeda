#!/usr/bin/env bash
# The cgroup v2 lane (issue 12): the shim's lifecycle tests
# (shim/tests/lifecycle.rs), the containerd end-to-end tests
# (integration/tests/containerd.rs), the CRI tests against runc
# (integration/tests/cri.rs: stats, updates, OOM, pod cgroups, bridge
# networking) and the main job, run in a VM with a
# pure cgroup v2 hierarchy (scripts/vm/run.sh) with the test binaries this
# repository builds here; then the systemd cgroup driver's tests
# (integration/tests/systemd_cgroup.rs) in a second VM with systemd as
# PID 1 (NRI_VM_INIT=systemd), once against each containerd line (1.6,
# 1.7, 2.1, 2.4). As root on Debian 12; .ci/run runs it after
# scripts/test.sh, whose test build it reuses.
#
# Exit status 0 when every test passes or fails as a known v2 divergence
# (the list below); any other failure, a suite that crashes or times out, a
# failed main job, or a VM that is not cgroup v2 exits 1. The VM's output is
# printed with a `vm| ` prefix, then the verdict; it is also kept in
# target/vm/lane.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/env.sh

# Tests that fail on cgroup v2 today because of bugs issue 12 lists: run,
# reported, not counted. SUITE::TEST, then the issue's item. Remove an
# entry when its fix lands (the lane says when one passes).
# Empty: the last one (r27, a failed create's cgroup left behind while
# the suite ran in parallel) is fixed (the rollback removes the cgroup
# with patience) and passed 5 lane runs in a row beside other load.
KNOWN_V2_DIVERGENCES=()

lane_start=$(date +%s)
# (scripts/vm/run.sh installs qemu.)
nri_need_packages pkg-config libseccomp-dev containerd runc busybox-static
nri_patch_crates
echo "== cgroup v2 lane: the test build (cargo test --workspace --no-run, what scripts/test.sh built)"
build=$(cargo test --workspace --locked --no-run --message-format=json)
exe() { # the executable of test target $1
    echo "$build" | grep '"reason":"compiler-artifact"' | grep -F "\"name\":\"$1\",\"src_path\"" |
        grep -F '"kind":["test"]' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1
}
lifecycle=$(exe lifecycle)
containerd=$(exe containerd)
cri=$(exe cri)
systemd_cgroup=$(exe systemd_cgroup)
[ -x "$lifecycle" ] && [ -x "$containerd" ] && [ -x "$cri" ] && [ -x "$systemd_cgroup" ] || {
    echo "lane: test binaries not found (lifecycle '$lifecycle', containerd '$containerd', cri '$cri', systemd_cgroup '$systemd_cgroup')" >&2
    exit 1
}
for b in containerd-shim-nri-shim-v2 nri-adjuster nri-test-plugin cri-update; do
    [ -x "target/debug/$b" ] || { echo "lane: target/debug/$b missing" >&2; exit 1; }
done

log=target/vm/lane.log
mkdir -p target/vm
echo "== cgroup v2 lane: booting the VM (qemu TCG; the tests take several minutes)"
vm_start=$(date +%s)
vm_rc=0
scripts/vm/run.sh scripts/vm/suites.sh "lifecycle=$lifecycle" "containerd=$containerd" "cri=$cri" main-job \
    > "$log" 2>&1 || vm_rc=$?
vm_secs=$(($(date +%s) - vm_start))
sed 's/^/vm| /' "$log"
sd_log=target/vm/lane-systemd.log
echo "== cgroup v2 lane, systemd variant: booting the VM with systemd as PID 1"
sd_start=$(date +%s)
sd_rc=0
# The suite against every containerd line the project tests (1.6, the
# host's, then scripts/lib/containerd-versions.sh's, then 2.4 from the Go
# peers, which the VM finds in the host's cache): nodes run the systemd
# driver on 1.7 and 2.x most.
. scripts/lib/containerd-versions.sh
. scripts/lib/go-peers.sh
nri_containerd_versions
nri_go_peers
sd_suites=("systemd_cgroup=$systemd_cgroup")
for line in "${NRI_CONTAINERD_LINES[@]%% *}" 2.4; do sd_suites+=("systemd_cgroup@$line=$systemd_cgroup"); done
NRI_VM_INIT=systemd NRI_VM_TIMEOUT=$((900 * ${#sd_suites[@]})) scripts/vm/run.sh scripts/vm/suites.sh "${sd_suites[@]}" \
    > "$sd_log" 2>&1 || sd_rc=$?
sd_secs=$(($(date +%s) - sd_start))
sed 's/^/vm-systemd| /' "$sd_log"

# The verdict.
problems=()
grep -q '^== cgroup: cgroup2fs ' "$log" || problems+=("the VM's /sys/fs/cgroup is not cgroup2 (or the VM did not run)")
declare -A known=()
for e in "${KNOWN_V2_DIVERGENCES[@]}"; do known[${e%%|*}]=${e#*|}; done
section() { # the lines of suite $1 in log $2 (the first VM's by default)
    awk -v s="$1" '$0 ~ "^== suite " s "( |$)" && $0 !~ " exit " {on=1; next}
                   $0 ~ "^== suite " s " exit " {on=0} on' "${2:-$log}"
}
passed=0
known_failed=()
for suite in lifecycle containerd cri; do
    status=$(sed -n "s/^== suite $suite exit //p" "$log")
    out=$(section "$suite")
    if [ -z "$status" ]; then
        # What CI's output tail must show: which tests were still running
        # (libtest names a test running over 60 s) and how far it got.
        stuck=$(echo "$out" | sed -n 's/^test \([^ ]*\) has been running for over 60 seconds$/\1/p' |
            while read -r t; do echo "$out" | grep -qE "^test $t \.\.\. (ok|FAILED)$" || echo "$t"; done)
        problems+=("suite $suite did not finish (the VM's time ran out): $(echo "$out" | grep -cE '^test [^ ]+ \.\.\. ok$' || true) tests passed; still running: ${stuck:-none named}; its last lines:
$(echo "$out" | tail -n 15 | cut -c1-300 | sed 's/^/      /')")
    elif [ "$status" != 0 ] && [ "$status" != 101 ]; then
        problems+=("suite $suite exited with status $status (124: timed out; otherwise crashed)")
    fi
    echo "$out" | grep -q '^test result: ' || { problems+=("suite $suite printed no test result"); continue; }
    passed=$((passed + $(echo "$out" | grep -cE '^test [^ ]+ \.\.\. ok$' || true)))
    failed=$( {
        echo "$out" | sed -n 's/^test \([^ ]*\) \.\.\. FAILED$/\1/p'
        echo "$out" | awk '/^failures:$/ {on=1; next} on && /^    [^ ]+$/ {print $1; next} {on=0}'
    } | sort -u)
    [ "$status" != 101 ] || [ -n "$failed" ] || problems+=("suite $suite failed without naming a test")
    for t in $failed; do
        if [ -n "${known[$suite::$t]:-}" ]; then
            known_failed+=("$suite::$t")
        else
            problems+=("$suite::$t failed:
$(echo "$out" | awk -v t="$t" '$0 == "---- " t " stdout ----" {on=1; n=0; next}
                               on && (/^---- / || /^failures:$/) {on=0} on && n++ < 25 {print "      " $0}')")
        fi
    done
done
# The systemd variant: every test passes, with systemd as PID 1 on cgroup v2.
grep -q '^== init: systemd$' "$sd_log" || problems+=("the systemd variant's PID 1 is not systemd (or its VM did not run)")
grep -q '^== cgroup: cgroup2fs ' "$sd_log" || problems+=("the systemd variant's /sys/fs/cgroup is not cgroup2")
for arg in "${sd_suites[@]}"; do
    name=${arg%%=*}
    sd_status=$(sed -n "s/^== suite $name exit //p" "$sd_log")
    sd_out=$(section "$name" "$sd_log")
    passed=$((passed + $(echo "$sd_out" | grep -cE '^test [^ ]+ \.\.\. ok$' || true)))
    if [ "$sd_status" != 0 ] || ! echo "$sd_out" | grep -q '^test result: ok'; then
        problems+=("systemd variant: suite $name exited with status ${sd_status:-none}:
$(echo "$sd_out" | grep -E '^test .* FAILED$|panicked|^  ' | head -n 25 | sed 's/^/      /')")
    fi
done
main=$(section main-job)
main_status=$(sed -n 's/^== suite main-job exit //p' "$log")
if [ "$main_status" != 0 ]; then
    problems+=("the main job exited with status ${main_status:-none}")
elif ! echo "$main" | grep -q 'FOO=from-nri-adjuster' || ! echo "$main" | grep -q 'memory limit: 134217728 bytes'; then
    problems+=("the main job's container did not see the plugin's env and 128 MiB memory limit")
else
    passed=$((passed + 1))
fi

echo "== cgroup v2 lane: known v2 divergences (failed as expected, not counted):"
for e in "${KNOWN_V2_DIVERGENCES[@]}"; do
    t=${e%%|*}
    if printf '%s\n' "${known_failed[@]}" | grep -qxF "$t"; then
        echo "   FAILED (known)  $t  -- ${e#*|}"
    elif grep -qE "^test ${t#*::} \.\.\. ok$" <<<"$(section "${t%%::*}")"; then
        echo "   PASSED          $t  -- fixed, or an intermittent one passing: once it keeps passing, remove it from KNOWN_V2_DIVERGENCES in $0"
    else
        echo "   DID NOT RUN     $t"
    fi
done
total=$(($(date +%s) - lane_start))
echo "== cgroup v2 lane: $passed passed, ${#known_failed[@]} known v2 divergences, ${#problems[@]} other failures; VM ${vm_secs} s (status $vm_rc), systemd VM ${sd_secs} s (status $sd_rc), lane ${total} s"
if [ ${#problems[@]} -gt 0 ]; then
    for p in "${problems[@]}"; do echo "FAIL: $p"; done
    exit 1
fi
