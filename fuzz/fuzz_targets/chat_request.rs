//! The chat request reader on raw bytes as a request body (worker/http/request/), with the
//! shipped settings and with tight ones, without headers and with a header of each kind.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let headers = kvmem_fuzz::Headers {
        session: Some("s-1".into()),
        key: Some("k-1".into()),
        character: Some("7".into()),
        timeout_ms: Some(" 250 ".into()),
    };
    for rules in [kvmem_fuzz::Rules::shipped(), kvmem_fuzz::Rules::tight()] {
        kvmem_fuzz::check_chat_request(body, &kvmem_fuzz::Headers::default(), &rules);
        kvmem_fuzz::check_chat_request(body, &headers, &rules);
    }
});
