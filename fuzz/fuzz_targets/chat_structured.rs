//! Structure-aware: a chat request built from fuzzer-chosen messages, roles, content parts,
//! ids, sampling fields, headers and settings, near each bound the reader checks; then the
//! same checks as `chat_request`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|plan: kvmem_fuzz::ChatPlan| {
    let (body, headers, rules) = plan.build();
    kvmem_fuzz::check_chat_request(&body, &headers, &rules);
});
