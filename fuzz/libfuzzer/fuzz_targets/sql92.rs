//! libFuzzer driver of `rocketgate_fuzz::sql92` (see fuzz/src/lib.rs for what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rocketgate_fuzz::sql92(data));
