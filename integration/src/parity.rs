//! Judging a behaviour both handlers have (runc's shim and nri-shim, on the
//! same input) by what Kubernetes and the CRI contract expect, not by
//! runc's answer: runc is the bar for what the contract leaves open, but a
//! runc that misses the contract under load (an OOM kill its shim did not
//! see, a page fault count that depends on the page cache) must not fail
//! a test of nri-shim.
//!
//! Each check prints the contract, runc's answer and nri-shim's. It fails
//! when nri-shim's answer breaks the contract (so also when the two differ
//! and runc is the one that keeps it). runc breaking the contract is
//! reported, never failed; a known runc flake ([`KNOWN_RUNC_FLAKES`]) says
//! why.
//!
//! The contract of a list of observations is written as one pattern per
//! line ([`line_matches`]): the line as it must read, where
//! `{a|b}` accepts either alternative at that place and `{*}` any text
//! (what the contract leaves to the containerd line or the kernel).

use std::fmt::Debug;

/// runc answers known to break the contract now and then on these
/// machines, and why: (what the check is called, a piece of runc's wrong
/// answer, the cause). Printed when seen, never failed.
pub const KNOWN_RUNC_FLAKES: &[(&str, &str, &str)] = &[(
    "OOM kill",
    "reason=Error",
    "runc's shim (containerd's runc v2 shim, cgroup v1) reads the OOM kill count when memory.oom_control \
     signals, which is before the kernel counts the kill; under load it reads the old count and reports \
     no OOM (nri-shim reads again for up to 2 s: shim/src/task/service/exit.rs)",
)];

/// Whether `line` is what `pattern` allows: the same text, where each
/// `{a|b|...}` of the pattern matches one of its alternatives and `{*}`
/// any text.
pub fn line_matches(pattern: &str, line: &str) -> bool {
    let Some(open) = pattern.find('{') else {
        return pattern == line;
    };
    let Some(close) = pattern[open..].find('}').map(|c| open + c) else {
        return pattern == line;
    };
    let (head, rest) = (&pattern[..open], &pattern[close + 1..]);
    let Some(tail) = line.strip_prefix(head) else {
        return false;
    };
    let alts = &pattern[open + 1..close];
    if alts == "*" {
        return (0..=tail.len())
            .filter(|i| tail.is_char_boundary(*i))
            .any(|i| line_matches(rest, &tail[i..]));
    }
    alts.split('|')
        .any(|alt| tail.strip_prefix(alt).is_some_and(|t| line_matches(rest, t)))
}

/// Why `lines` break the contract `patterns`, if they do.
fn lines_break(patterns: &[&str], lines: &[String]) -> Option<String> {
    if patterns.len() != lines.len() {
        return Some(format!(
            "{} lines where the contract has {}",
            lines.len(),
            patterns.len()
        ));
    }
    let wrong: Vec<String> = patterns
        .iter()
        .zip(lines)
        .filter(|(p, l)| !line_matches(p, l))
        .map(|(p, l)| format!("{l:?} where the contract says {p:?}"))
        .collect();
    (!wrong.is_empty()).then(|| wrong.join("; "))
}

/// Prints the verdict on runc's answer: fine, a known flake, or a miss
/// that fails nothing.
fn report_runc(what: &str, runc: &str, broken: Option<String>) {
    let Some(why) = broken else {
        return;
    };
    match KNOWN_RUNC_FLAKES
        .iter()
        .find(|(name, answer, _)| what.starts_with(name) && runc.contains(answer))
    {
        Some((_, _, cause)) => println!("  runc misses the contract here, a known runc flake ({cause}): {why}"),
        None => println!("  runc misses the contract here (reported, not failed): {why}"),
    }
}

/// One value both handlers produced: nri-shim's must equal `contract`;
/// runc's is reported.
///
/// # Panics
/// When nri-shim's value differs from `contract`.
#[track_caller]
pub fn expect_value<T: Debug + PartialEq>(what: &str, contract: &T, runc: &T, nri: &T) {
    println!("{what}\n  contract: {contract:?}\n  runc:     {runc:?}\n  nri-shim: {nri:?}");
    report_runc(
        what,
        &format!("{runc:?}"),
        (runc != contract).then(|| format!("{runc:?}")),
    );
    assert!(
        nri == contract,
        "{what}: nri-shim breaks the contract\n  contract: {contract:?}\n  nri-shim: {nri:?}\n  runc:     {runc:?}"
    );
}

/// Lines of observations both handlers produced: nri-shim's must match
/// `contract` line by line (see [`line_matches`]); runc's are reported.
///
/// # Panics
/// When a line of nri-shim's breaks its pattern, or the counts differ.
#[track_caller]
pub fn expect_lines<S: AsRef<str>>(what: &str, contract: &[S], runc: &[String], nri: &[String]) {
    let patterns: Vec<&str> = contract.iter().map(AsRef::as_ref).collect();
    println!("{what}\n  contract: {patterns:?}\n  runc:     {runc:?}\n  nri-shim: {nri:?}");
    report_runc(what, &runc.join("\n"), lines_break(&patterns, runc));
    if let Some(why) = lines_break(&patterns, nri) {
        panic!("{what}: nri-shim breaks the contract: {why}\n  nri-shim: {nri:#?}\n  runc:     {runc:#?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_accept_their_alternatives_only() {
        assert!(line_matches("a: 1", "a: 1"));
        assert!(!line_matches("a: 1", "a: 2"));
        assert!(line_matches("faults: {zero|nonzero}", "faults: zero"));
        assert!(line_matches("faults: {zero|nonzero}", "faults: nonzero"));
        assert!(!line_matches("faults: {zero|nonzero}", "faults: absent"));
        assert!(!line_matches("faults: {zero|nonzero}", "faults: nonzero!"));
        assert!(line_matches("{a|b}, {c|d} end", "b, c end"));
        assert!(!line_matches("{a|b}, {c|d} end", "b, e end"));
        // An alternative that is a prefix of another still lets the rest match.
        assert!(line_matches("{x|xy}z", "xyz"));
        assert!(line_matches(
            "timeout: {*} exceeded, {*}",
            "timeout: 1s ctx exceeded, took 2s"
        ));
        assert!(line_matches("a{*}", "a"));
        assert!(!line_matches("a{*}b", "a-c"));
    }

    #[test]
    fn runc_breaking_the_contract_fails_nothing() {
        expect_value("OOM kill", &"reason=OOMKilled", &"reason=Error", &"reason=OOMKilled");
        expect_lines(
            "stats",
            &["major: {zero|nonzero}"],
            &["major: absent".to_string()],
            &["major: zero".to_string()],
        );
    }

    #[test]
    #[should_panic(expected = "nri-shim breaks the contract")]
    fn nri_shim_breaking_it_fails_even_where_runc_agrees() {
        expect_value("x", &1, &2, &2);
    }

    #[test]
    #[should_panic(expected = "1 lines where the contract has 2")]
    fn a_missing_line_fails() {
        expect_lines(
            "x",
            &["a", "b"],
            &["a".to_string(), "b".to_string()],
            &["a".to_string()],
        );
    }
}
