//! libFuzzer driver of `rocketgate_fuzz::auth` (see fuzz/src/lib.rs for what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rocketgate_fuzz::auth(data));
