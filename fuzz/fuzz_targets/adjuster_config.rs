//! Fuzz target `adjuster_config`: see [`nri_fuzz::adjuster_config`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nri_fuzz::adjuster_config::run(data));
