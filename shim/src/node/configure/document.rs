//! containerd's `config.toml` as a `toml_edit` document: which layout
//! (version 2 for containerd 1.6 and 1.7, 3 for 2.0 to 2.3, 4 for 2.4), the tables and keys
//! of the runtime handler, and the edit `configure` makes, keeping the
//! file's comments, order and indentation.

use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item, Table, Value};

use super::{ConfigureError, ContainerdNri, OPTIONS_FILE, RUNC_TYPE, RUNTIME_TYPE, Request, SystemdCgroup};

/// The config versions `configure` edits. The runtime handlers' tables
/// moved between 2 and 3 (containerd 2.0); version 4 (containerd 2.4)
/// moved only the server settings (`[grpc]`, `[ttrpc]`, `[debug]`,
/// `[metrics]`) into plugin tables, and keeps 3's handler tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    /// containerd 1.6, 1.7.
    V2,
    /// containerd 2.0 to 2.3.
    V3,
    /// containerd 2.4.
    V4,
}

impl Version {
    pub(super) fn cri_plugin(self) -> &'static str {
        match self {
            Version::V2 => "io.containerd.grpc.v1.cri",
            Version::V3 | Version::V4 => "io.containerd.cri.v1.runtime",
        }
    }

    pub(super) fn number(self) -> i64 {
        match self {
            Version::V2 => 2,
            Version::V3 => 3,
            Version::V4 => 4,
        }
    }

    /// A containerd 2.x layout.
    pub(super) fn is_2x(self) -> bool {
        self != Version::V2
    }
}

pub(super) fn read(path: &Path) -> Result<String, ConfigureError> {
    std::fs::read_to_string(path).map_err(|source| ConfigureError::Io {
        path: path.to_path_buf(),
        source,
    })
}

pub(super) fn write(path: &Path, text: &str) -> Result<(), ConfigureError> {
    let io = |source| ConfigureError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    // The file keeps its mode: an operator's 0600 config must not come back
    // 0644. A new file gets the umask's default, as containerd's own.
    let mode = std::fs::metadata(path)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
        .unwrap_or(0o666);
    crate::private::replace(path, "nri-shim.tmp", text.as_bytes(), false, mode).map_err(io)
}

pub(super) fn parse(path: &Path, text: &str) -> Result<DocumentMut, ConfigureError> {
    text.parse::<DocumentMut>().map_err(|e| ConfigureError::Parse {
        path: path.to_path_buf(),
        message: e.to_string().trim().to_string(),
    })
}

pub(super) fn version_of(path: &Path, doc: &DocumentMut) -> Result<Version, ConfigureError> {
    match doc.get("version").and_then(Item::as_integer) {
        Some(2) => Ok(Version::V2),
        Some(3) => Ok(Version::V3),
        Some(4) => Ok(Version::V4),
        other => Err(ConfigureError::Version {
            path: path.to_path_buf(),
            found: other.map_or_else(|| "absent".to_string(), |v| v.to_string()),
        }),
    }
}

/// The table at `keys`, made (implicit, as dotted headers are) where
/// missing. `display` names it in errors.
pub(super) fn table_at<'a>(
    path: &Path,
    doc: &'a mut DocumentMut,
    keys: &[&str],
    display: &str,
) -> Result<&'a mut Table, ConfigureError> {
    let mut t = doc.as_table_mut();
    for k in keys {
        let entry = t.entry(k).or_insert_with(|| {
            let mut n = Table::new();
            n.set_implicit(true);
            Item::Table(n)
        });
        t = entry.as_table_mut().ok_or_else(|| ConfigureError::Value {
            path: path.to_path_buf(),
            table: display.to_string(),
            key: k.to_string(),
            message: "not a table".into(),
        })?;
    }
    Ok(t)
}

/// Sets `key` to `v` in `t`, keeping the line's indentation: an existing
/// key keeps its own, a new one takes that of the table's first key (or
/// `indent`).
pub(super) fn set(t: &mut Table, key: &str, v: impl Into<Value>, indent: &str) {
    if t.contains_key(key) {
        t[key] = Item::Value(v.into());
        return;
    }
    let prefix = t
        .iter()
        .next()
        .and_then(|(k, _)| t.key(k))
        .and_then(|k| k.leaf_decor().prefix())
        .and_then(|p| p.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| indent.to_string());
    t.insert(key, Item::Value(v.into()));
    if let Some(mut k) = t.key_mut(key) {
        k.leaf_decor_mut().set_prefix(prefix);
    }
}

/// The indentation of `t`'s header line and of its keys, from the file
/// (`"    "`, ...), or none.
pub(super) fn indents(t: Option<&Table>) -> (String, String) {
    let Some(t) = t else {
        return (String::new(), String::new());
    };
    let header = t
        .decor()
        .prefix()
        .and_then(|p| p.as_str())
        .map(|p| p.rsplit('\n').next().unwrap_or("").to_string())
        .unwrap_or_default();
    let keys = t
        .iter()
        .next()
        .and_then(|(k, _)| t.key(k))
        .and_then(|k| k.leaf_decor().prefix())
        .and_then(|p| p.as_str())
        .unwrap_or("")
        .to_string();
    (header, keys)
}

/// The table at `keys`, if there is one.
pub(super) fn table_get<'a>(doc: &'a DocumentMut, keys: &[&str]) -> Option<&'a Table> {
    let mut t = doc.as_table();
    for k in keys {
        t = t.get(k)?.as_table()?;
    }
    Some(t)
}

/// `plugins."X".containerd.runtimes` as a header names it.
pub(super) fn runtimes_display(v: Version, name: &str) -> String {
    format!("plugins.\"{}\".containerd.runtimes.{name}", v.cri_plugin())
}

/// containerd's own runc handler's `SystemdCgroup`, the node's driver.
pub(super) fn runc_systemd(doc: &DocumentMut, v: Version) -> bool {
    table_get(
        doc,
        &["plugins", v.cri_plugin(), "containerd", "runtimes", "runc", "options"],
    )
    .and_then(|t| t.get("SystemdCgroup"))
    .and_then(Item::as_bool)
    .unwrap_or(false)
}

/// The NRI socket nri-shim's plugins connect to, from its config file
/// (the default when the file is missing).
pub(super) fn shim_socket(req: &Request) -> Result<String, ConfigureError> {
    let path = req.shim_config_path();
    let default = "/var/run/nri/nri.sock".to_string();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(default),
        Err(source) => return Err(ConfigureError::Io { path, source }),
    };
    let doc = parse(&path, &text)?;
    Ok(table_get(&doc, &["nri"])
        .and_then(|t| t.get("socket_path"))
        .and_then(Item::as_str)
        .map(str::to_string)
        .unwrap_or(default))
}

/// `key` of `table` back to its value in `before` (removed when `before`
/// lacks it), keeping the line's decoration.
pub(super) fn restore_key(table: &mut Table, before: Option<&Table>, key: &str) {
    match before.and_then(|t| t.get(key)).and_then(Item::as_value) {
        Some(old) => {
            if let Some(v) = table.get_mut(key).and_then(Item::as_value_mut) {
                let decor = v.decor().clone();
                *v = old.clone();
                *v.decor_mut() = decor;
            }
        }
        None => {
            table.remove(key);
        }
    }
}

/// A directory the config imports (`dir/*.toml`), where a drop-in goes.
pub(super) fn imported_dir(doc: &DocumentMut) -> Option<PathBuf> {
    doc.get("imports")?
        .as_array()?
        .iter()
        .filter_map(|v| v.as_str())
        .find_map(|p| p.strip_suffix("/*.toml").map(PathBuf::from))
}

/// The edit itself, on one document of layout `v`: the handler table, the
/// default runtime, containerd's NRI. `main` is the whole config (for the
/// runc handler's driver and the NRI section); `doc` the one written
/// (the same, or a drop-in).
pub(super) fn edit(
    req: &Request,
    path: &Path,
    main: &DocumentMut,
    doc: &mut DocumentMut,
    v: Version,
) -> Result<(), ConfigureError> {
    let plugin = v.cri_plugin();
    let display = runtimes_display(v, &req.name);
    // A handler of that name must be ours.
    if let Some(t) = table_get(main, &["plugins", plugin, "containerd", "runtimes", &req.name]) {
        let found = t.get("runtime_type").and_then(Item::as_str).unwrap_or_default();
        let ours = found == RUNTIME_TYPE
            || (found == RUNC_TYPE
                && t.get("runtime_path")
                    .and_then(Item::as_str)
                    .is_some_and(|p| p.ends_with("containerd-shim-nri-shim-v2")));
        if !ours {
            return Err(ConfigureError::OtherHandler {
                path: path.to_path_buf(),
                table: display,
                found: found.to_string(),
            });
        }
    }
    // containerd's NRI: on by default in 2.x, off unless enabled in 1.7.
    // A version 2 file does not tell 1.x from 2.x (containerd 2.x reads
    // it too, Debian's 2.x package ships one, and runs its NRI then):
    // --containerd-nri=disable writes `disable = true` on either version
    // unless the file says so already.
    let nri = "io.containerd.nri.v1.nri";
    let nri_display = format!("plugins.\"{nri}\"");
    let nri_table = table_get(main, &["plugins", nri]);
    let nri_disable = nri_table.and_then(|t| t.get("disable")).and_then(Item::as_bool);
    let nri_on = match nri_disable {
        Some(disable) => !disable,
        None => v.is_2x(),
    };
    let nri_socket = nri_table
        .and_then(|t| t.get("socket_path"))
        .and_then(Item::as_str)
        .unwrap_or("/var/run/nri/nri.sock")
        .to_string();
    let may_serve = nri_on || (nri_disable.is_none() && req.containerd_nri == ContainerdNri::Disable);
    if may_serve && nri_socket == shim_socket(req)? {
        match req.containerd_nri {
            ContainerdNri::Keep => {
                return Err(ConfigureError::NriCollision {
                    path: path.to_path_buf(),
                    table: nri_display,
                    socket: nri_socket,
                    shim_config: req.shim_config_path(),
                });
            }
            ContainerdNri::Disable => {
                let indent = indents(nri_table).1;
                set(
                    table_at(path, doc, &["plugins", nri], &nri_display)?,
                    "disable",
                    true,
                    &indent,
                );
            }
        }
    }
    let systemd = match req.systemd_cgroup {
        SystemdCgroup::Auto => runc_systemd(main, v),
        SystemdCgroup::On => true,
        SystemdCgroup::Off => false,
    };
    // Indented as the runc handler is (the default configs indent by depth).
    let runc = table_get(main, &["plugins", plugin, "containerd", "runtimes", "runc"]);
    let (header, key_indent) = indents(runc);
    let (options_header, options_indent) = indents(table_get(
        main,
        &["plugins", plugin, "containerd", "runtimes", "runc", "options"],
    ));
    let handler = table_at(
        path,
        doc,
        &["plugins", plugin, "containerd", "runtimes", &req.name],
        &display,
    )?;
    if handler.is_implicit() {
        handler.set_implicit(false);
        handler.decor_mut().set_prefix(format!("\n{header}"));
    }
    if req.as_runc {
        set(handler, "runtime_type", RUNC_TYPE, &key_indent);
        set(handler, "runtime_path", req.binary.display().to_string(), &key_indent);
    } else {
        set(handler, "runtime_type", RUNTIME_TYPE, &key_indent);
    }
    if systemd {
        let options = handler
            .entry("options")
            .or_insert_with(|| {
                let mut t = Table::new();
                t.decor_mut().set_prefix(format!("\n{options_header}"));
                Item::Table(t)
            })
            .as_table_mut()
            .ok_or_else(|| ConfigureError::Value {
                path: path.to_path_buf(),
                table: display.clone(),
                key: "options".into(),
                message: "not a table".into(),
            })?;
        set(options, "SystemdCgroup", true, &options_indent);
        // containerd 1.6 passes a handler of another type only the
        // options file's path (1.7+ the table itself).
        if v == Version::V2 && !req.as_runc {
            set(options, "ConfigPath", format!("/{OPTIONS_FILE}"), &options_indent);
        }
    }
    if req.default {
        let containerd = table_at(
            path,
            doc,
            &["plugins", plugin, "containerd"],
            &format!("plugins.\"{plugin}\".containerd"),
        )?;
        set(containerd, "default_runtime_name", req.name.as_str(), "");
    }
    Ok(())
}
