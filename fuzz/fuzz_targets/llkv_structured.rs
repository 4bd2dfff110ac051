//! Structure-aware: a valid LLKV1 file built from fuzzer-chosen fields, then header-line
//! edits, body edits and byte damage, with the header and payload CRC32Cs optionally
//! recomputed afterwards so the edits reach the field parsing, the limits, the length
//! check and zstd instead of dying at a CRC. An unedited file must decode exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|plan: kvmem_fuzz::Plan| {
    kvmem_fuzz::check_plan(&plan);
});
