//! Fuzz target `merge`: see [`nri_fuzz::merge`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nri_fuzz::merge::run(data));
