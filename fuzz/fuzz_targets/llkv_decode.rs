//! `decode` on arbitrary bytes, with the worker's limits and with `Limits::LOOSE`: never a
//! panic, and a successful decode must re-encode to a file that decodes to the same thing.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kvmem_fuzz::check_decode(data);
});
