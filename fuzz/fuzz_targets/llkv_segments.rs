//! `parse_segments` on arbitrary text and token counts. Input: 4 bytes of token count
//! (little-endian), then the text (lossy UTF-8). Each input is also tried with the count
//! the text's numbers add up to, so the success path is reached often.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let tokens = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    let text = String::from_utf8_lossy(&data[4..]);
    kvmem_fuzz::check_segments(&text, tokens);
    let sum = text
        .split(',')
        .filter_map(|item| item.split_once(':'))
        .filter_map(|(_, n)| n.split('@').next()?.parse::<u32>().ok())
        .fold(0u32, u32::wrapping_add);
    kvmem_fuzz::check_segments(&text, sum);
});
