//! The shim's TOML configuration ([`nri_shim::config::Config::parse`]) and
//! its Go-style durations ([`nri_shim::config::parse_duration`]).
//!
//! Properties: no panic on any text (errors point into the text by line
//! and column, which must not slice it at a wrong place); a configuration
//! that parses turns into adaptation options; a duration that parses
//! prints back to one that parses to the same value.

use std::path::Path;

use nri_shim::config::{Config, parse_duration};

/// Runs one input; panics when a property fails.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse(text, Path::new("/etc/nri-shim/config.toml")) {
        Ok(cfg) => {
            let opts = cfg.nri.options();
            assert!(opts.socket_path.is_absolute(), "a relative socket path passed");
            assert!(!opts.request_timeout.is_zero(), "a zero request timeout passed");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    if let Some(d) = parse_duration(text) {
        let printed = format!("{}ns", d.as_nanos());
        if d.as_nanos() <= i64::MAX as u128 {
            assert_eq!(parse_duration(&printed), Some(d), "{printed} does not parse back");
        }
    }
}
