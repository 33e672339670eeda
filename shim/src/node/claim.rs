//! Start claims: how `start` keeps a running daemon from exiting on idle
//! before containerd has dialled it for the task it was started for.
//!
//! containerd runs `start`, reads the task address it prints, then dials
//! it and sends Create. A daemon with no task counts the time since its
//! last connection; `start`'s probe connection was such activity, but only
//! for `idle_timeout`: when containerd took longer than that between
//! `start` and its dial (a loaded node, a short `idle_timeout`), the
//! daemon went away idle in between and the Create failed with
//! `task.sock: no such file or directory`.
//!
//! So `start` leaves a claim, `<daemon dir>/claims/<namespace>:<id>`
//! (containerd's identifiers have no `:`), under the start lock, which the
//! daemon also holds for its last idle check; the daemon does not exit on
//! idle while a claim younger than [`CLAIM_TTL`] exists. Create of that
//! task removes it (whatever the create's outcome); a claim whose Create
//! never comes (containerd gave up) expires.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

/// How long a claim keeps an idle daemon up without its Create: far above
/// containerd's time from `start` to its dial (milliseconds, seconds on a
/// very loaded node), short enough that a lost claim delays an idle exit
/// only once by this much.
pub const CLAIM_TTL: Duration = Duration::from_secs(60);

fn dir(daemon_dir: &Path) -> PathBuf {
    daemon_dir.join("claims")
}

fn path(daemon_dir: &Path, ns: &str, id: &str) -> PathBuf {
    dir(daemon_dir).join(format!("{ns}:{id}"))
}

/// Leaves (or renews) the claim of task `ns/id`.
///
/// # Errors
/// The claims directory or file could not be written (an I/O error naming
/// the path).
pub fn write(daemon_dir: &Path, ns: &str, id: &str) -> std::io::Result<()> {
    let d = dir(daemon_dir);
    crate::private::create_dir_all(&d)?;
    let p = path(daemon_dir, ns, id);
    // Data written each time, so a renewed claim gets a fresh modification
    // time (the content, the time in seconds, is for a human reader).
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    crate::private::write(&p, format!("{secs}\n"))
}

/// Removes the claim of task `ns/id` (its Create has come); nothing if
/// there is none.
pub fn consume(daemon_dir: &Path, ns: &str, id: &str) {
    let _ = std::fs::remove_file(path(daemon_dir, ns, id));
}

/// The number of claims younger than `ttl`; older ones are removed. A
/// claim whose age cannot be read counts as young (it stays until it can
/// be aged).
pub fn pending(daemon_dir: &Path, ttl: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir(daemon_dir)) else {
        return 0;
    };
    let now = SystemTime::now();
    let mut young = 0;
    for e in entries.flatten() {
        let age = e
            .metadata()
            .and_then(|m| m.modified())
            .map(|t| now.duration_since(t).unwrap_or_default());
        match age {
            Ok(age) if age >= ttl => {
                let _ = std::fs::remove_file(e.path());
            }
            _ => young += 1,
        }
    }
    young
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_pending_until_consumed() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(pending(d.path(), CLAIM_TTL), 0, "no claims directory yet");
        write(d.path(), "default", "c1").unwrap();
        write(d.path(), "k8s.io", "c1").unwrap();
        write(d.path(), "default", "c1").unwrap();
        assert_eq!(pending(d.path(), CLAIM_TTL), 2);
        consume(d.path(), "default", "c1");
        assert_eq!(pending(d.path(), CLAIM_TTL), 1);
        consume(d.path(), "default", "never-claimed");
        consume(d.path(), "k8s.io", "c1");
        assert_eq!(pending(d.path(), CLAIM_TTL), 0);
    }

    #[test]
    fn an_expired_claim_is_removed_and_a_renewed_one_is_young() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "default", "old").unwrap();
        let old = path(d.path(), "default", "old");
        let long_ago = SystemTime::now() - 2 * CLAIM_TTL;
        std::fs::File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        write(d.path(), "default", "new").unwrap();
        assert_eq!(pending(d.path(), CLAIM_TTL), 1);
        assert!(!old.exists(), "expired claim left");
        // A claim written again counts from then.
        let new = path(d.path(), "default", "new");
        std::fs::File::options()
            .write(true)
            .open(&new)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        write(d.path(), "default", "new").unwrap();
        assert_eq!(pending(d.path(), CLAIM_TTL), 1);
    }

    #[test]
    fn a_claims_directory_that_cannot_be_made_is_an_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("claims"), b"a file").unwrap();
        let e = write(d.path(), "default", "c1").unwrap_err();
        assert!(e.to_string().contains("claims"), "{e}");
    }
}
