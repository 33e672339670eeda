//! `configure containerd` and `unconfigure containerd`: the runtime handler
//! in containerd's `config.toml`, as an operator would write it by hand,
//! kept comments and formatting (`toml_edit`), idempotent, undone byte for
//! byte.
//!
//! containerd 1.6 and 1.7 read config version 2 (the CRI plugin's handlers
//! under `plugins."io.containerd.grpc.v1.cri".containerd.runtimes`), 2.0 to
//! 2.3 version 3 (`plugins."io.containerd.cri.v1.runtime".containerd.runtimes`),
//! 2.4 version 4 (the same handler tables; its server settings moved into
//! plugin tables).
//! Where the main file imports a directory (`imports = ["/etc/containerd/
//! conf.d/*.toml"]`) the handler goes into a drop-in file there, and the
//! main file is not touched; containerd merges imported files into it.
//! Otherwise the main file is edited in place, its original kept next to
//! it (`<file>.nri-shim.orig`), which `unconfigure` puts back when the file
//! is still what `configure` made of it.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use toml_edit::{DocumentMut, Item, value};

mod document;
use document::*;

/// The runtime type containerd maps to this binary.
pub const RUNTIME_TYPE: &str = "io.containerd.nri-shim.v2";
/// runc's runtime type (the `--as-runc` declaration).
pub const RUNC_TYPE: &str = "io.containerd.runc.v2";
/// Suffix of the original kept next to an edited config file.
pub const ORIGINAL_SUFFIX: &str = ".nri-shim.orig";
/// Suffix of the SHA-256 of what `configure` last wrote there (so that
/// `unconfigure` knows the file was not changed since).
pub const SUM_SUFFIX: &str = ".nri-shim.sha256";
/// The drop-in file written into an imported directory.
pub const DROP_IN: &str = "nri-shim.toml";
/// The options file a version 2 config's handler names with `ConfigPath`
/// (containerd 1.6 passes a non-runc handler only that path).
pub const OPTIONS_FILE: &str = "etc/nri-shim/runtime-options.toml";

/// Why the config was not changed; each names the file and, where one is
/// at fault, the table and key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigureError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// containerd's config does not exist (containerd runs on its built-in
    /// defaults then, which name no config version to edit).
    #[error(
        "{path}: no such file: containerd runs on its built-in defaults without it; write them first with \
         `containerd config default > {path}` (the containerd that runs on this node), then configure again"
    )]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// The file is no TOML.
    #[error("{path}: not TOML: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (line and column).
        message: String,
    },
    /// A config version this tool does not know.
    #[error(
        "{path}: key `version` is {found}: only containerd's config versions 2 (containerd 1.6, 1.7), 3 \
         (containerd 2.0 to 2.3) and 4 (containerd 2.4) are understood; write the file with `containerd config \
         default` first"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// What `version` holds (`absent` when missing).
        found: String,
    },
    /// A handler of that name runs another runtime.
    #[error(
        "{path}: table [{table}] key `runtime_type` is {found:?}: a handler of that name already runs another \
         runtime; choose another name with --runtime-name"
    )]
    OtherHandler {
        /// The file.
        path: PathBuf,
        /// The handler's table.
        table: String,
        /// Its runtime type.
        found: String,
    },
    /// containerd's own NRI would serve the socket nri-shim's plugins use.
    #[error(
        "{path}: table [{table}] key `disable` leaves containerd's own NRI on, serving {socket}, the socket \
         nri-shim's plugins connect to (`socket_path` of {shim_config}): pass --containerd-nri=disable to turn \
         containerd's off, or give nri-shim another socket_path"
    )]
    NriCollision {
        /// The file.
        path: PathBuf,
        /// containerd's NRI table.
        table: String,
        /// The socket both would serve.
        socket: String,
        /// The shim config naming it.
        shim_config: PathBuf,
    },
    /// A config value of the wrong kind.
    #[error("{path}: table [{table}] key `{key}`: {message}")]
    Value {
        /// The file.
        path: PathBuf,
        /// The table.
        table: String,
        /// The key.
        key: String,
        /// What was wrong.
        message: String,
    },
    /// `unconfigure` found the edited file changed since.
    #[error(
        "{path}: changed since `configure` wrote it; the nri-shim handler was taken out of it, the original \
         ({original}) is left for you to compare"
    )]
    ChangedSince {
        /// The file.
        path: PathBuf,
        /// The original kept.
        original: PathBuf,
    },
}

/// The cgroup driver the handler gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemdCgroup {
    /// As containerd's own runc handler has it (its `SystemdCgroup`
    /// option), the node's driver.
    Auto,
    /// `SystemdCgroup = true`.
    On,
    /// No `SystemdCgroup`.
    Off,
}

/// What to do with containerd's own NRI when it would serve nri-shim's
/// socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerdNri {
    /// Leave it; refuse when it collides.
    Keep,
    /// Turn it off (`disable = true`).
    Disable,
}

/// What `configure containerd` is asked to do.
#[derive(Debug, Clone)]
pub struct Request {
    /// The host's root (`/`, or where a DaemonSet mounted it).
    pub root: PathBuf,
    /// containerd's config (default `<root>/etc/containerd/config.toml`).
    pub config: Option<PathBuf>,
    /// The handler's name (RuntimeClass `handler`).
    pub name: String,
    /// Make it containerd's default runtime.
    pub default: bool,
    /// The cgroup driver option.
    pub systemd_cgroup: SystemdCgroup,
    /// containerd's own NRI.
    pub containerd_nri: ContainerdNri,
    /// Declare the handler with runc's type and `runtime_path` (containerd
    /// 2.0 to 2.3.3 ask only such handlers for their features).
    pub as_runc: bool,
    /// The shim binary on the host (for `runtime_path`).
    pub binary: PathBuf,
    /// The shim's config (its NRI socket), default
    /// `<root>/etc/nri-shim/config.toml`.
    pub shim_config: Option<PathBuf>,
    /// Print what would change; change nothing.
    pub dry_run: bool,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            root: PathBuf::from("/"),
            config: None,
            name: "nri-shim".into(),
            default: false,
            systemd_cgroup: SystemdCgroup::Auto,
            containerd_nri: ContainerdNri::Keep,
            as_runc: false,
            binary: PathBuf::from("/usr/local/bin/containerd-shim-nri-shim-v2"),
            shim_config: None,
            dry_run: false,
        }
    }
}

/// A path under the host's root.
fn under(root: &Path, p: &str) -> PathBuf {
    root.join(p.trim_start_matches('/'))
}

impl Request {
    fn config_path(&self) -> PathBuf {
        self.config
            .clone()
            .unwrap_or_else(|| under(&self.root, "etc/containerd/config.toml"))
    }

    fn shim_config_path(&self) -> PathBuf {
        self.shim_config
            .clone()
            .unwrap_or_else(|| under(&self.root, "etc/nri-shim/config.toml"))
    }
}

/// What `configure` wrote or would write: (path, new text, old text).
type Change = (PathBuf, String, Option<String>);

/// Works out the files `req` changes, without writing.
fn plan(req: &Request) -> Result<Vec<Change>, ConfigureError> {
    let path = req.config_path();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ConfigureError::Missing { path }),
        Err(source) => return Err(ConfigureError::Io { path, source }),
    };
    let main = parse(&path, &text)?;
    let v = version_of(&path, &main)?;
    let mut changes = Vec::new();
    match imported_dir(&main) {
        Some(dir) => {
            let dir = if dir.is_absolute() {
                under(&req.root, &dir.display().to_string())
            } else {
                dir
            };
            let drop_in = dir.join(DROP_IN);
            let old = std::fs::read_to_string(&drop_in).ok();
            let mut doc = DocumentMut::new();
            doc.insert("version", value(v.number()));
            let mut header = String::new();
            let _ = writeln!(
                header,
                "# Written by `containerd-shim-nri-shim-v2 configure containerd`; removed by `unconfigure containerd`."
            );
            edit(req, &drop_in, &main, &mut doc, v)?;
            changes.push((drop_in, header + &doc.to_string(), old));
        }
        None => {
            let original = PathBuf::from(format!("{}{ORIGINAL_SUFFIX}", path.display()));
            // Idempotent: the edit is made on what the file holds now.
            let mut doc = main.clone();
            edit(req, &path, &main, &mut doc, v)?;
            let new = doc.to_string();
            if new != text && !original.exists() {
                changes.push((original, text.clone(), None));
            }
            let sum = PathBuf::from(format!("{}{SUM_SUFFIX}", path.display()));
            changes.push((
                sum.clone(),
                format!("{}\n", sha256(&new)),
                std::fs::read_to_string(&sum).ok(),
            ));
            changes.push((path, new, Some(text)));
        }
    }
    let systemd_options = changes
        .iter()
        .any(|(_, new, _)| new.contains(&format!("ConfigPath = \"/{OPTIONS_FILE}\"")));
    if systemd_options {
        let file = under(&req.root, OPTIONS_FILE);
        let want = "# Written by `containerd-shim-nri-shim-v2 configure containerd`: the handler's options\n\
                    # for containerd 1.6, which passes them by path.\nSystemdCgroup = true\n"
            .to_string();
        changes.push((file.clone(), want, std::fs::read_to_string(&file).ok()));
    }
    Ok(changes)
}

/// `configure containerd`: returns what changed (a unified diff of each
/// file), empty when nothing needed to; `--dry-run` only returns it.
///
/// # Errors
/// [`ConfigureError`], nothing written.
pub fn configure(req: &Request) -> Result<String, ConfigureError> {
    let changes = plan(req)?;
    let mut report = String::new();
    for (path, new, old) in &changes {
        if old.as_deref() == Some(new.as_str()) {
            continue;
        }
        let shown = path.display().to_string();
        if shown.ends_with(ORIGINAL_SUFFIX) {
            let _ = writeln!(report, "keep the original as {shown}");
        } else if shown.ends_with(SUM_SUFFIX) {
            let _ = writeln!(report, "note what was written in {shown}");
        } else {
            report.push_str(&diff(path, old.as_deref().unwrap_or(""), new));
        }
    }
    if !req.dry_run {
        for (path, new, old) in &changes {
            if old.as_deref() != Some(new.as_str()) {
                write(path, new)?;
            }
        }
    }
    Ok(report)
}

/// `unconfigure containerd`: the drop-in and the options file removed, or
/// the edited file put back byte for byte from its original (when it is
/// still what `configure` made of it; else the handler is taken out and
/// the original left). Returns what it did.
///
/// # Errors
/// [`ConfigureError`]; [`ConfigureError::ChangedSince`] after taking the
/// handler out of a file changed since.
pub fn unconfigure(req: &Request) -> Result<String, ConfigureError> {
    let path = req.config_path();
    let text = read(&path)?;
    let main = parse(&path, &text)?;
    let v = version_of(&path, &main)?;
    let mut report = String::new();
    let remove = |p: &Path, report: &mut String| -> Result<(), ConfigureError> {
        if p.exists() {
            if !req.dry_run {
                std::fs::remove_file(p).map_err(|source| ConfigureError::Io {
                    path: p.to_path_buf(),
                    source,
                })?;
            }
            let _ = writeln!(report, "remove {}", p.display());
        }
        Ok(())
    };
    if let Some(dir) = imported_dir(&main) {
        let dir = if dir.is_absolute() {
            under(&req.root, &dir.display().to_string())
        } else {
            dir
        };
        remove(&dir.join(DROP_IN), &mut report)?;
    }
    remove(&under(&req.root, OPTIONS_FILE), &mut report)?;
    let original = PathBuf::from(format!("{}{ORIGINAL_SUFFIX}", path.display()));
    let Ok(orig_text) = std::fs::read_to_string(&original) else {
        return Ok(report);
    };
    // The file as configure last wrote it: the original is put back.
    let sum = PathBuf::from(format!("{}{SUM_SUFFIX}", path.display()));
    let written = std::fs::read_to_string(&sum).unwrap_or_default();
    if written.trim() == sha256(&text) {
        if !req.dry_run {
            write(&path, &orig_text)?;
        }
        report.push_str(&diff(&path, &text, &orig_text));
        remove(&original, &mut report)?;
        remove(&sum, &mut report)?;
        return Ok(report);
    }
    // Changed since: take out only what configure put in (the handler,
    // and the keys it set elsewhere, back to the original's values), so
    // that containerd starts with the other edits kept.
    let orig = parse(&original, &orig_text)?;
    let mut doc = main.clone();
    if let Some(c) = doc
        .get_mut("plugins")
        .and_then(|p| p.get_mut(v.cri_plugin()))
        .and_then(|p| p.get_mut("containerd"))
        .and_then(Item::as_table_mut)
    {
        if let Some(t) = c.get_mut("runtimes").and_then(Item::as_table_mut) {
            t.remove(&req.name);
        }
        // A default naming the removed handler would stop CRI from starting.
        if c.get("default_runtime_name").and_then(Item::as_str) == Some(req.name.as_str()) {
            restore_key(
                c,
                table_get(&orig, &["plugins", v.cri_plugin(), "containerd"]),
                "default_runtime_name",
            );
        }
    }
    if let Some(n) = doc
        .get_mut("plugins")
        .and_then(|p| p.get_mut("io.containerd.nri.v1.nri"))
        .and_then(Item::as_table_mut)
    {
        let before = table_get(&orig, &["plugins", "io.containerd.nri.v1.nri"]);
        if n.get("disable").and_then(Item::as_bool) == Some(true)
            && before.and_then(|t| t.get("disable")).and_then(Item::as_bool) != Some(true)
        {
            restore_key(n, before, "disable");
        }
    }
    let new = doc.to_string();
    if !req.dry_run {
        write(&path, &new)?;
    }
    report.push_str(&diff(&path, &text, &new));
    Err(ConfigureError::ChangedSince { path, original })
}

fn sha256(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A unified diff of `path` from `old` to `new` (`similar`'s).
fn diff(path: &Path, old: &str, new: &str) -> String {
    let name = path.display().to_string();
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&name, &name)
        .to_string()
}

/// What `-h` says of `configure` and `unconfigure`.
pub const USAGE: &str = "\
       containerd-shim-nri-shim-v2 configure containerd [--root DIR] [--config FILE] [--runtime-name NAME]
           [--default] [--systemd-cgroup auto|true|false] [--containerd-nri keep|disable] [--as-runc]
           [--binary PATH] [--shim-config FILE] [--dry-run]
       containerd-shim-nri-shim-v2 unconfigure containerd [--root DIR] [--config FILE] [--runtime-name NAME] [--dry-run]
";

/// Parses `configure containerd ...` / `unconfigure containerd ...`
/// (`args` after the action): the request.
///
/// # Errors
/// A message naming the flag or value refused.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Request, String> {
    let mut req = Request::default();
    let mut it = args.into_iter();
    match it.next().as_deref() {
        Some("containerd") => {}
        Some(other) => return Err(format!("configures containerd only, not {other:?}")),
        None => return Err("which runtime to configure: containerd".into()),
    }
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let mut val = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().ok_or_else(|| format!("{name} needs a value")),
            }
        };
        match name.trim_start_matches('-') {
            "root" => req.root = PathBuf::from(val()?),
            "config" => req.config = Some(PathBuf::from(val()?)),
            "runtime-name" => req.name = val()?,
            "default" => req.default = true,
            "as-runc" => req.as_runc = true,
            "dry-run" => req.dry_run = true,
            "binary" => req.binary = PathBuf::from(val()?),
            "shim-config" => req.shim_config = Some(PathBuf::from(val()?)),
            "systemd-cgroup" => {
                req.systemd_cgroup = match val()?.as_str() {
                    "auto" => SystemdCgroup::Auto,
                    "true" => SystemdCgroup::On,
                    "false" => SystemdCgroup::Off,
                    v => return Err(format!("--systemd-cgroup {v:?}: auto, true or false")),
                }
            }
            "containerd-nri" => {
                req.containerd_nri = match val()?.as_str() {
                    "keep" => ContainerdNri::Keep,
                    "disable" => ContainerdNri::Disable,
                    v => return Err(format!("--containerd-nri {v:?}: keep or disable")),
                }
            }
            _ => return Err(format!("unknown flag {a}")),
        }
    }
    if req.name.is_empty() || req.name.contains(['.', '"', ' ']) {
        return Err(format!(
            "--runtime-name {:?}: a handler name (letters, digits, -, _)",
            req.name
        ));
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V2: &str = "version = 2\n\n[plugins]\n\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    # the CRI plugin\n    [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n      default_runtime_name = \"runc\"\n      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]\n        [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n          runtime_type = \"io.containerd.runc.v2\"\n          [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n            SystemdCgroup = false\n";
    const V3: &str = "version = 3\nimports = []\n\n[plugins]\n  [plugins.'io.containerd.cri.v1.runtime'.containerd]\n    default_runtime_name = 'runc'\n    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n      runtime_type = 'io.containerd.runc.v2'\n      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n        SystemdCgroup = true\n  [plugins.'io.containerd.nri.v1.nri']\n    disable = false\n    socket_path = '/var/run/nri/nri.sock'\n";

    fn host(config: &str) -> (tempfile::TempDir, Request) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/containerd")).unwrap();
        std::fs::write(dir.path().join("etc/containerd/config.toml"), config).unwrap();
        let req = Request {
            root: dir.path().to_path_buf(),
            ..Request::default()
        };
        (dir, req)
    }

    fn file(req: &Request) -> String {
        std::fs::read_to_string(req.config_path()).unwrap()
    }

    #[test]
    fn the_config_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let (_d, req) = host(V2);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        std::fs::set_permissions(req.config_path(), std::fs::Permissions::from_mode(0o600)).unwrap();
        configure(&req).unwrap();
        assert_eq!(mode(&req.config_path()), 0o600);
        unconfigure(&req).unwrap();
        assert_eq!(mode(&req.config_path()), 0o600);
    }

    #[test]
    fn version_2_gets_the_handler_once_keeping_comments_and_comes_back_byte_for_byte() {
        let (_d, req) = host(V2);
        let report = configure(&req).unwrap();
        assert!(
            report.contains("+        [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nri-shim]"),
            "{report}"
        );
        let once = file(&req);
        assert!(once.contains("    # the CRI plugin\n"), "{once}");
        assert!(once.contains("runtime_type = \"io.containerd.nri-shim.v2\""), "{once}");
        // runc's handler has no systemd driver: none for ours either.
        assert!(!once.contains("nri-shim.options"), "{once}");
        // A second run changes no byte and says nothing.
        assert_eq!(configure(&req).unwrap(), "");
        assert_eq!(file(&req), once);
        let report = unconfigure(&req).unwrap();
        assert!(report.contains("remove"), "{report}");
        assert_eq!(file(&req), V2);
        assert!(!PathBuf::from(format!("{}{ORIGINAL_SUFFIX}", req.config_path().display())).exists());
    }

    #[test]
    fn a_missing_config_is_refused_with_the_command_that_writes_it() {
        let (d, req) = host(V2);
        std::fs::remove_file(req.config_path()).unwrap();
        let e = configure(&req).unwrap_err().to_string();
        assert!(
            e.contains("no such file") && e.contains("containerd config default >"),
            "{e}"
        );
        assert!(
            std::fs::read_dir(d.path().join("etc/containerd"))
                .unwrap()
                .next()
                .is_none(),
            "a refusal writes nothing"
        );
    }

    #[test]
    fn a_dry_run_changes_nothing_and_shows_the_diff() {
        let (_d, mut req) = host(V2);
        req.dry_run = true;
        let report = configure(&req).unwrap();
        assert!(report.starts_with("keep the original"), "{report}");
        assert!(report.contains("@@"), "{report}");
        assert_eq!(file(&req), V2);
        assert!(!PathBuf::from(format!("{}{ORIGINAL_SUFFIX}", req.config_path().display())).exists());
    }

    #[test]
    fn version_3_with_containerds_nri_on_the_same_socket_is_refused_unless_turned_off() {
        let (_d, mut req) = host(V3);
        let e = configure(&req).unwrap_err().to_string();
        assert!(
            e.contains("config.toml: table [plugins.\"io.containerd.nri.v1.nri\"] key `disable`")
                && e.contains("--containerd-nri=disable"),
            "{e}"
        );
        assert_eq!(file(&req), V3, "nothing written");
        req.containerd_nri = ContainerdNri::Disable;
        req.default = true;
        configure(&req).unwrap();
        let text = file(&req);
        assert!(text.contains("    disable = true\n"), "{text}");
        assert!(text.contains("    default_runtime_name = \"nri-shim\"\n"), "{text}");
        // runc's handler has the systemd driver: ours too (auto), and no
        // ConfigPath (containerd 2.x passes the table).
        assert!(
            text.contains("SystemdCgroup = true\n") && !text.contains("ConfigPath"),
            "{text}"
        );
        unconfigure(&req).unwrap();
        assert_eq!(file(&req), V3);
    }

    #[test]
    fn version_4_has_version_3s_handler_tables() {
        let v4 = V3.replace("version = 3\n", "version = 4\n")
            + "  [plugins.'io.containerd.server.v1.grpc']\n    address = '/run/containerd/containerd.sock'\n";
        let (_d, mut req) = host(&v4);
        req.containerd_nri = ContainerdNri::Disable;
        configure(&req).unwrap();
        let text = file(&req);
        assert!(
            text.contains("[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nri-shim]")
                && text.contains("runtime_type = \"io.containerd.nri-shim.v2\""),
            "{text}"
        );
        assert!(text.starts_with("version = 4\n"), "{text}");
        unconfigure(&req).unwrap();
        assert_eq!(file(&req), v4);
    }

    #[test]
    fn version_2_with_containerd_nri_disable_turns_it_off_for_containerd_2_reading_it() {
        let (_d, mut req) = host(V2);
        configure(&req).unwrap();
        assert!(
            !file(&req).contains("io.containerd.nri.v1.nri"),
            "keep: a version 2 file is left as it is"
        );
        unconfigure(&req).unwrap();
        assert_eq!(file(&req), V2);
        req.containerd_nri = ContainerdNri::Disable;
        configure(&req).unwrap();
        let text = file(&req);
        assert!(
            text.contains("[plugins.\"io.containerd.nri.v1.nri\"]") && text.contains("disable = true"),
            "{text}"
        );
        assert_eq!(configure(&req).unwrap(), "", "idempotent");
        unconfigure(&req).unwrap();
        assert_eq!(file(&req), V2);
    }

    #[test]
    fn another_socket_for_nri_shim_needs_no_change_of_containerds_nri() {
        let (d, mut req) = host(V3);
        let shim = d.path().join("etc/nri-shim/config.toml");
        std::fs::create_dir_all(shim.parent().unwrap()).unwrap();
        std::fs::write(&shim, "[nri]\nsocket_path = \"/var/run/nri-shim/nri.sock\"\n").unwrap();
        req.shim_config = Some(shim);
        configure(&req).unwrap();
        assert!(file(&req).contains("    disable = false\n"));
    }

    #[test]
    fn a_config_importing_a_directory_gets_a_drop_in_and_is_not_touched() {
        let (d, mut req) = host(&V3.replace("imports = []", "imports = ['/etc/containerd/conf.d/*.toml']"));
        req.containerd_nri = ContainerdNri::Disable;
        let before = file(&req);
        configure(&req).unwrap();
        assert_eq!(file(&req), before);
        let drop_in = d.path().join("etc/containerd/conf.d").join(DROP_IN);
        let text = std::fs::read_to_string(&drop_in).unwrap();
        assert!(
            text.starts_with("# Written by") && text.contains("version = 3"),
            "{text}"
        );
        assert!(text.contains("runtime_type = \"io.containerd.nri-shim.v2\""), "{text}");
        assert!(text.contains("disable = true"), "{text}");
        // Idempotent, and undone by removing it.
        assert_eq!(configure(&req).unwrap(), "");
        unconfigure(&req).unwrap();
        assert!(!drop_in.exists());
        assert_eq!(file(&req), before);
    }

    #[test]
    fn what_it_does_not_understand_is_named() {
        let (_d, req) = host("root = \"/var/lib/containerd\"\n");
        let e = configure(&req).unwrap_err().to_string();
        assert!(e.contains("config.toml: key `version` is absent"), "{e}");
        let (_d, req) = host(&V2.replace("runtimes.runc]", "runtimes.nri-shim]"));
        let e = configure(&req).unwrap_err().to_string();
        assert!(
            e.contains("table [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nri-shim] key `runtime_type` is \"io.containerd.runc.v2\""),
            "{e}"
        );
        let (_d, req) = host("version = 2\n[plugins\n");
        assert!(configure(&req).unwrap_err().to_string().contains("not TOML"));
    }

    #[test]
    fn version_2_with_the_systemd_driver_names_an_options_file_for_containerd_1_6() {
        let (d, mut req) = host(V2);
        req.systemd_cgroup = SystemdCgroup::On;
        configure(&req).unwrap();
        let text = file(&req);
        assert!(
            text.contains("ConfigPath = \"/etc/nri-shim/runtime-options.toml\""),
            "{text}"
        );
        let options = d.path().join(OPTIONS_FILE);
        assert!(
            std::fs::read_to_string(&options)
                .unwrap()
                .contains("SystemdCgroup = true")
        );
        unconfigure(&req).unwrap();
        assert!(!options.exists());
        assert_eq!(file(&req), V2);
    }

    #[test]
    fn as_runc_declares_runcs_type_and_the_binary() {
        let (_d, mut req) = host(V2);
        req.as_runc = true;
        configure(&req).unwrap();
        let text = file(&req);
        assert!(
            text.contains("runtime_type = \"io.containerd.runc.v2\"")
                && text.contains("runtime_path = \"/usr/local/bin/containerd-shim-nri-shim-v2\""),
            "{text}"
        );
        // Ours, so a second run accepts it.
        assert_eq!(configure(&req).unwrap(), "");
    }

    #[test]
    fn a_file_changed_since_loses_only_the_handler() {
        let (_d, req) = host(V2);
        configure(&req).unwrap();
        let edited = file(&req).replace(
            "SystemdCgroup = false",
            "SystemdCgroup = false\n            BinaryName = \"x\"",
        );
        std::fs::write(req.config_path(), &edited).unwrap();
        let e = unconfigure(&req).unwrap_err().to_string();
        assert!(e.contains("changed since"), "{e}");
        let text = file(&req);
        assert!(!text.contains("nri-shim]") && text.contains("BinaryName"), "{text}");
    }

    #[test]
    fn a_file_changed_since_gets_back_the_default_runtime_and_containerds_nri() {
        let (_d, mut req) = host(V3);
        req.default = true;
        req.containerd_nri = ContainerdNri::Disable;
        configure(&req).unwrap();
        let text = file(&req);
        assert!(
            text.contains("default_runtime_name = \"nri-shim\"") && text.contains("disable = true"),
            "{text}"
        );
        std::fs::write(
            req.config_path(),
            text.replace("imports = []", "imports = []\n# an edit"),
        )
        .unwrap();
        unconfigure(&req).unwrap_err();
        let text = file(&req);
        assert!(
            text.contains("# an edit")
                && text.contains("default_runtime_name = 'runc'")
                && text.contains("disable = false")
                && !text.contains("nri-shim"),
            "{text}"
        );
    }

    #[test]
    fn arguments() {
        let args = |a: &[&str]| parse_args(a.iter().map(|s| s.to_string()));
        let r = args(&[
            "containerd",
            "--default",
            "--runtime-name=fast",
            "--systemd-cgroup",
            "false",
        ])
        .unwrap();
        assert!(r.default && r.name == "fast" && r.systemd_cgroup == SystemdCgroup::Off);
        assert!(args(&["crio"]).unwrap_err().contains("containerd only"));
        assert!(
            args(&["containerd", "--bogus"])
                .unwrap_err()
                .contains("unknown flag --bogus")
        );
        assert!(args(&["containerd", "--systemd-cgroup", "maybe"]).is_err());
        assert!(args(&["containerd", "--runtime-name", "a.b"]).is_err());
    }
}
