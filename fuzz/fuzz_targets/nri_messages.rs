//! Fuzz target `nri_messages`: see [`nri_fuzz::nri_messages`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nri_fuzz::nri_messages::run(data));
