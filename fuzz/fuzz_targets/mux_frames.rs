//! Fuzz target `mux_frames`: see [`nri_fuzz::mux_frames`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nri_fuzz::mux_frames::run(data));
