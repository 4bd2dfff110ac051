//! `parse_header` on arbitrary bytes: never a panic, and an accepted header stays within
//! the limits, tiles its tokens with segments and ends at the blank line.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kvmem_fuzz::check_header(data);
});
