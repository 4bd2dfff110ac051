//! Tells cargo to rebuild when `migrations/` changes: `sqlx::migrate!` embeds the files at
//! build time but cannot see a newly added one by itself (sqlx's documented build script).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
