//! libFuzzer driver of `rocketgate_fuzz::mqtt_session` (see fuzz/src/lib.rs for what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rocketgate_fuzz::mqtt_session(data));
