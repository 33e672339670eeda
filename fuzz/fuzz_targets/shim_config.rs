//! Fuzz target `shim_config`: see [`nri_fuzz::shim_config`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nri_fuzz::shim_config::run(data));
