#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| weightbay_fuzz::codec(input));
