//! Snapshot files on local disk: one per session scope under `KVMEM_KV_DIR`, replaced
//! atomically, with corrupt files quarantined. They are the whole store by default and the
//! local cache in front of an object store otherwise ([`super::store`]).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::format::{decode, Limits, Snapshot, SnapshotError, MAX_HEADER_BYTES};

/// Snapshot files in one directory, one per session scope, replaced atomically.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
    limits: Limits,
}

/// The result of looking for a session's snapshot.
#[derive(Debug)]
pub enum Loaded {
    /// No snapshot yet.
    Missing,
    /// A verified snapshot. Whether it fits the running engine is the caller's check.
    Found(Box<Snapshot>),
    /// The file was corrupt and has been moved aside to `quarantined` (a path, or an
    /// object store URL).
    Corrupt {
        error: SnapshotError,
        quarantined: Option<String>,
    },
    /// The file could not be read at all (permissions, I/O).
    Unreadable(String),
}

impl FileStore {
    pub fn new(dir: impl Into<PathBuf>, limits: Limits) -> FileStore {
        FileStore {
            dir: dir.into(),
            limits,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file for a scope key (see [`scope_key`]).
    pub fn path(&self, scope: &str) -> PathBuf {
        self.dir.join(format!("{scope}.llkv"))
    }

    /// Reads and verifies; a corrupt file is quarantined, never deleted.
    pub fn load(&self, scope: &str) -> Loaded {
        let path = self.path(scope);
        let len = match fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Loaded::Missing,
            Err(e) => return Loaded::Unreadable(e.to_string()),
        };
        // Bound the read by what a valid file could be, before allocating.
        let max_len = self.max_len();
        if len > max_len {
            let error = SnapshotError::Limit {
                field: "file size",
                value: len,
                limit: max_len,
            };
            return self.quarantine_corrupt(&path, error);
        }
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Loaded::Missing,
            Err(e) => return Loaded::Unreadable(e.to_string()),
        };
        match verify(&bytes, scope, self.limits) {
            Ok(snap) => Loaded::Found(Box::new(snap)),
            Err(error) => self.quarantine_corrupt(&path, error),
        }
    }

    /// The most bytes a valid file could have under these limits.
    pub fn max_len(&self) -> u64 {
        MAX_HEADER_BYTES as u64 + self.limits.max_tokens as u64 * 4 + self.limits.max_state_bytes
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn quarantine_corrupt(&self, path: &Path, error: SnapshotError) -> Loaded {
        Loaded::Corrupt {
            error,
            quarantined: quarantine_path(path).map(|p| p.display().to_string()),
        }
    }

    /// Moves a scope's snapshot aside as `<scope>.<millis>.bad`; never deletes it.
    pub fn quarantine(&self, scope: &str) -> Option<PathBuf> {
        quarantine_path(&self.path(scope))
    }

    /// The directory's entries; none when it does not exist yet (nothing saved).
    fn entries(&self) -> io::Result<Option<fs::ReadDir>> {
        match fs::read_dir(&self.dir) {
            Ok(entries) => Ok(Some(entries)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The scopes with a snapshot file here, oldest first, with their sizes: what a cache
    /// in front of an object store starts from.
    pub fn list(&self) -> io::Result<Vec<(String, u64)>> {
        let Some(entries) = self.entries()? else {
            return Ok(Vec::new());
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(scope) = name.strip_suffix(".llkv") else {
                continue;
            };
            if scope.starts_with('.') {
                continue;
            }
            let meta = entry.metadata()?;
            found.push((meta.modified()?, scope.to_string(), meta.len()));
        }
        found.sort();
        Ok(found.into_iter().map(|(_, s, len)| (s, len)).collect())
    }

    /// Writes tmp → fsync → rename → fsync(dir). Returns the file size.
    pub fn save(&self, scope: &str, encoded: &[u8]) -> io::Result<u64> {
        self.save_with(scope, encoded, &|_| {})
    }

    /// [`save`](Self::save), calling `at` with the step reached (`mid_write`,
    /// `before_rename`): the seam reliability tests use to stop a writer at an exact point.
    pub fn save_with(&self, scope: &str, encoded: &[u8], at: &dyn Fn(&str)) -> io::Result<u64> {
        fs::create_dir_all(&self.dir)?;
        let path = self.path(scope);
        let tmp = self
            .dir
            .join(format!(".{scope}.{}.tmp", std::process::id()));
        let result = (|| {
            let mut f = File::create(&tmp)?;
            let (first, rest) = encoded.split_at(encoded.len() / 2);
            f.write_all(first)?;
            at("mid_write");
            f.write_all(rest)?;
            f.sync_all()?;
            at("before_rename");
            fs::rename(&tmp, &path)?;
            File::open(&self.dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map(|_| encoded.len() as u64)
    }

    /// Deletes temp files that writers killed before their rename left behind (`save`
    /// names them per process, so a restarted worker never reuses one). Only files older
    /// than `min_age` go: a save takes well under a second, and another worker sharing
    /// the directory may be writing right now. Returns how many were removed.
    pub fn sweep_stale_tmp(&self, min_age: std::time::Duration) -> io::Result<usize> {
        let Some(entries) = self.entries()? else {
            return Ok(0);
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !(name.starts_with('.') && name.ends_with(".tmp")) {
                continue;
            }
            let age = entry.metadata()?.modified()?.elapsed().unwrap_or_default();
            if age >= min_age && fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The quarantined copies here (`<scope>.<millis>.bad`), with the scope, when each was
    /// moved aside, and its size.
    pub fn quarantined(&self) -> io::Result<Vec<Quarantined>> {
        let Some(entries) = self.entries()? else {
            return Ok(Vec::new());
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((scope, at_millis)) = parse_quarantined(&name) else {
                continue;
            };
            found.push(Quarantined {
                scope: scope.to_string(),
                at_millis,
                len: entry.metadata()?.len(),
                path: entry.path(),
            });
        }
        Ok(found)
    }

    /// Deletes the quarantined copies moved aside before `before_millis` (Unix time);
    /// returns how many went and their bytes.
    pub fn sweep_quarantine(&self, before_millis: u64) -> io::Result<(u64, u64)> {
        let (mut removed, mut bytes) = (0, 0);
        for q in self.quarantined()? {
            if q.at_millis < before_millis && remove_if_there(&q.path)? {
                removed += 1;
                bytes += q.len;
            }
        }
        Ok((removed, bytes))
    }

    /// Deletes a scope's snapshot and its quarantined copies; returns (files, quarantined
    /// copies, bytes) removed. Nothing there removes nothing.
    pub fn erase(&self, scope: &str) -> io::Result<(u64, u64, u64)> {
        let (mut files, mut quarantined, mut bytes) = (0, 0, 0);
        let path = self.path(scope);
        let len = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if remove_if_there(&path)? {
            files += 1;
            bytes += len;
        }
        for q in self.quarantined()? {
            if q.scope == scope && remove_if_there(&q.path)? {
                quarantined += 1;
                bytes += q.len;
            }
        }
        Ok((files, quarantined, bytes))
    }

    /// The sweep's erase of many scopes at once: each scope's file and quarantined copies
    /// written before the time it was erased (Unix milliseconds), never a newer one (a
    /// session id used again after its erase). One listing of the directory for all of
    /// them. Returns (files, quarantined copies, bytes) removed, and the scopes it removed
    /// a file of.
    pub fn erase_written_before(
        &self,
        erased: &HashMap<String, u64>,
    ) -> io::Result<(u64, u64, u64)> {
        let (mut files, mut quarantined, mut bytes) = (0, 0, 0);
        for (scope, at) in erased {
            let path = self.path(scope);
            let Ok(meta) = fs::metadata(&path) else {
                continue;
            };
            if millis(meta.modified()?) < *at && remove_if_there(&path)? {
                files += 1;
                bytes += meta.len();
            }
        }
        for q in self.quarantined()? {
            if erased.get(&q.scope).is_some_and(|at| q.at_millis < *at) && remove_if_there(&q.path)?
            {
                quarantined += 1;
                bytes += q.len;
            }
        }
        Ok((files, quarantined, bytes))
    }

    /// Removes a session's snapshot (after a rollback run, or by ops).
    pub fn remove(&self, scope: &str) -> io::Result<()> {
        match fs::remove_file(self.path(scope)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// A quarantined copy of a scope's snapshot.
#[derive(Debug, Clone)]
pub struct Quarantined {
    pub path: PathBuf,
    pub scope: String,
    /// When it was moved aside, in Unix milliseconds (from its name).
    pub at_millis: u64,
    pub len: u64,
}

/// `<scope>.<millis>.bad` into its scope and stamp; the same name is used for a quarantined
/// object's last path segment.
pub fn parse_quarantined(name: &str) -> Option<(&str, u64)> {
    let (scope, stamp) = name.strip_suffix(".bad")?.rsplit_once('.')?;
    let at = stamp.parse().ok()?;
    (!scope.is_empty() && !scope.starts_with('.')).then_some((scope, at))
}

/// Deletes a file; false when it was already gone.
fn remove_if_there(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Decodes and checks a snapshot's bytes for `scope`: every check of [`decode`], and a
/// snapshot of another scope is refused like a damaged one.
pub fn verify(bytes: &[u8], scope: &str, limits: Limits) -> Result<Snapshot, SnapshotError> {
    let snap = decode(bytes, limits)?;
    if snap.header.scope != scope {
        return Err(SnapshotError::Malformed(
            "snapshot belongs to another scope".into(),
        ));
    }
    Ok(snap)
}

fn quarantine_path(path: &Path) -> Option<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let bad = path.with_extension(format!("{stamp}.bad"));
    fs::rename(path, &bad).ok().map(|_| bad)
}

/// The file-name-safe key for a session's scope: the same session id under another user
/// or character never shares a snapshot.
pub fn scope_key(user_id: &str, character_id: i64, session_id: &str) -> String {
    let mut h = Sha256::new();
    for part in [user_id, &character_id.to_string(), session_id] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(&h.finalize()[..16])
}

/// A file time in Unix milliseconds (0 before the epoch).
fn millis(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::format::encode;
    use crate::snapshot::format::tests::{header, sample};

    #[test]
    fn store_quarantines_corrupt_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path(), Limits::LOOSE);
        let (mut h, _) = sample();
        h.scope = "scope1".into();
        let file = encode(&mut h, &[1, 2, 3, 4, 5], &[9u8; 100]).unwrap();
        store.save("scope1", &file).unwrap();
        assert!(matches!(store.load("scope1"), Loaded::Found(_)));
        let mut bad = file.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        store.save("scope1", &bad).unwrap();
        match store.load("scope1") {
            Loaded::Corrupt {
                quarantined: Some(q),
                ..
            } => assert!(Path::new(&q).exists() && q.ends_with(".bad")),
            other => panic!("expected quarantine, got {other:?}"),
        }
        assert!(matches!(store.load("scope1"), Loaded::Missing));
    }

    #[test]
    fn stale_temp_files_are_swept_and_fresh_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path(), Limits::LOOSE);
        let old = dir.path().join(".scope1.4242.tmp");
        let fresh = dir.path().join(".scope2.4243.tmp");
        let snapshot = dir.path().join("scope3.llkv");
        for p in [&old, &fresh, &snapshot] {
            std::fs::write(p, b"x").unwrap();
        }
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        let removed = store
            .sweep_stale_tmp(std::time::Duration::from_secs(600))
            .unwrap();
        assert_eq!(removed, 1);
        assert!(!old.exists() && fresh.exists() && snapshot.exists());
        let missing = FileStore::new(dir.path().join("nope"), Limits::LOOSE);
        assert_eq!(
            missing.sweep_stale_tmp(std::time::Duration::ZERO).unwrap(),
            0
        );
    }

    #[test]
    fn erase_removes_a_scopes_file_and_quarantined_copies_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path(), Limits::LOOSE);
        for (name, len) in [
            ("aa.llkv", 10),
            ("aa.1700000000000.bad", 7),
            ("aa.1700000000001.bad", 5),
            ("aab.llkv", 3),
            ("aab.1700000000000.bad", 2),
            ("bb.llkv", 4),
        ] {
            std::fs::write(dir.path().join(name), vec![0u8; len]).unwrap();
        }
        assert_eq!(store.erase("aa").unwrap(), (1, 2, 22));
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["aab.1700000000000.bad", "aab.llkv", "bb.llkv"]);
        assert_eq!(store.erase("aa").unwrap(), (0, 0, 0));
    }

    #[test]
    fn quarantine_older_than_the_retention_is_swept() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path(), Limits::LOOSE);
        for name in [
            "s1.1000.bad",
            "s2.3000.bad",
            "s3.llkv",
            "junk.bad",
            ".s4.1000.bad",
        ] {
            std::fs::write(dir.path().join(name), b"xy").unwrap();
        }
        assert_eq!(store.sweep_quarantine(2000).unwrap(), (1, 2));
        assert!(!dir.path().join("s1.1000.bad").exists());
        for kept in ["s2.3000.bad", "s3.llkv", "junk.bad", ".s4.1000.bad"] {
            assert!(dir.path().join(kept).exists(), "{kept}");
        }
        assert_eq!(store.sweep_quarantine(2000).unwrap(), (0, 0));
    }

    #[test]
    fn a_snapshot_under_another_scope_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path(), Limits::LOOSE);
        let mut h = header();
        h.scope = "other".into();
        let file = encode(&mut h, &[1, 2, 3, 4, 5], &[1u8; 10]).unwrap();
        store.save("mine", &file).unwrap();
        assert!(matches!(store.load("mine"), Loaded::Corrupt { .. }));
    }

    #[test]
    fn scope_keys_separate_users() {
        assert_ne!(scope_key("u1", 1, "s"), scope_key("u2", 1, "s"));
        assert_ne!(scope_key("u1", 1, "s"), scope_key("u1", 2, "s"));
        assert_ne!(scope_key("u1", 12, "s"), scope_key("u11", 2, "s"));
        assert_eq!(scope_key("u1", 1, "s").len(), 32);
    }
}
