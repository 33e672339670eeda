//! Fuzz target `adjust`: see [`nri_fuzz::adjust`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nri_fuzz::adjust::run(data));
