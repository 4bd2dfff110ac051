//! Writes the seed corpora under fuzz/corpus/<target>/: valid LLKV1 files (compressed and
//! not, with and without segments) for the decode and header targets, segment tables for
//! the segments target. Run: cargo run --manifest-path fuzz/Cargo.toml --example seeds
use std::fs;
use std::path::Path;

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(name), bytes).unwrap();
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let files = kvmem_fuzz::seed_files();
    for (name, file) in &files {
        // Every seed must be a valid snapshot.
        kvmem_fuzz::snapshot::decode(file, kvmem_fuzz::REALISTIC).unwrap();
        write(&root.join("llkv_decode"), name, file);
        write(&root.join("llkv_header"), name, file);
    }
    let tables: [(&str, &str, u32); 8] = [
        ("empty", "", 0),
        ("base", "B:57", 57),
        ("turns", "B:57,T:120,D:30,T:88", 295),
        ("nobase", "T:5,D:2", 7),
        ("misplaced-base", "T:3,B:2", 5),
        ("zero", "B:0,T:5", 5),
        ("short", "B:3,T:2", 6),
        ("unknown-kind", "X:5", 5),
    ];
    for (name, text, tokens) in tables {
        let mut bytes = tokens.to_le_bytes().to_vec();
        bytes.extend_from_slice(text.as_bytes());
        write(&root.join("llkv_segments"), &format!("seed-{name}"), &bytes);
    }
    println!(
        "{} snapshot seeds, {} segment seeds",
        files.len(),
        tables.len()
    );
}
