#!/usr/bin/env bash
# scripts/vm/suites.sh NAME=TEST_BINARY... [main-job]: what the cgroup v2
# lane runs inside the VM (scripts/vm/lane.sh passes the arguments), one
# after the other, each bounded by a timeout, each between
# `== suite NAME` and `== suite NAME exit STATUS` lines. A NAME of the
# form SUITE@LINE runs the binary against that containerd line
# (NRI_CONTAINERD=LINE, e.g. systemd_cgroup@2.1). A test suite gets
# NRI_VM_SUITE_TIMEOUT seconds (default 900; the lane takes about 7 minutes
# in all), the main job 300: together within run.sh's 2400.
set -u
echo "== cgroup: $(stat -fc %T /sys/fs/cgroup) on $(uname -r), $(nproc) cpus"
echo "== init: $(cat /proc/1/comm)"
for arg in "$@"; do
    case $arg in
    main-job)
        echo "== suite main-job"
        NRI_SHIM_BIN_DIR=target/debug timeout -k 10 300 scripts/main-job.sh 2>&1
        echo "== suite main-job exit $?"
        ;;
    *=*)
        name=${arg%%=*}
        echo "== suite $name (${arg#*=})"
        line=
        case $name in *@*) line=${name#*@} ;; esac
        NRI_CONTAINERD=${line:-${NRI_CONTAINERD:-}} timeout -k 10 "${NRI_VM_SUITE_TIMEOUT:-900}" "${arg#*=}" 2>&1
        echo "== suite $name exit $?"
        ;;
    esac
done
