//! The command line containerd gives a v2 shim (Go `flag` syntax):
//! `-namespace N -address A -publish-binary B -id ID [-bundle DIR] [-debug] ACTION`.

use std::path::PathBuf;

/// Parsed shim flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// containerd namespace of the task.
    pub namespace: String,
    /// containerd's gRPC socket (the shim daemon is keyed on it).
    pub address: String,
    /// The containerd binary (for `publish`; unused here).
    pub publish_binary: String,
    /// Task id.
    pub id: String,
    /// Bundle directory (given to `delete`; `start` runs in it).
    pub bundle: Option<PathBuf>,
    /// containerd runs at debug level.
    pub debug: bool,
    /// `-v`: print the version.
    pub version: bool,
    /// `-h`: print the usage.
    pub help: bool,
    /// `-info`: print the runtime info protobuf (see [`crate::info`]).
    pub info: bool,
    /// `start`, `delete`, `inspect`, `upgrade`, or the internal `daemon`
    /// and `upgrade-check`.
    pub action: String,
}

/// Why the command line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    /// A flag needs a value.
    #[error("flag {0} needs a value")]
    MissingValue(String),
    /// A flag this shim does not know.
    #[error("unknown flag {0}")]
    UnknownFlag(String),
    /// More than one positional argument.
    #[error("unexpected argument {0:?}")]
    Unexpected(String),
    /// `start` or `delete` without a flag containerd always passes (run by
    /// hand, it would start a daemon on the system's NRI socket keyed on
    /// an empty containerd address, or delete nothing and exit 0).
    #[error("{action} needs -{flag} (containerd passes it)")]
    Missing {
        /// The action.
        action: &'static str,
        /// The missing flag, without its dash.
        flag: &'static str,
    },
}

/// What `-h` prints.
pub const USAGE: &str = "\
usage: containerd-shim-nri-shim-v2 -namespace NS -address CONTAINERD_SOCKET -id ID [-bundle DIR] [-publish-binary BIN] [-debug] start|delete
       containerd-shim-nri-shim-v2 [-namespace NS] inspect CONTAINER_ID
       containerd-shim-nri-shim-v2 [-address CONTAINERD_SOCKET] upgrade
       containerd-shim-nri-shim-v2 -v
       containerd-shim-nri-shim-v2 -info < RUNTIME_OPTIONS
       containerd-shim-nri-shim-v2 configure|unconfigure containerd [flags]   (see below)

A containerd shim v2 (runtime type io.containerd.nri-shim.v2) that passes
every container through NRI plugins and runs it with libcontainer.
containerd runs it; it is not meant to be run by hand.

  start    print the task address, starting the node's shim daemon if needed
  delete   clean up after a task whose shim is gone; prints its exit status
  inspect  [-namespace NS] CONTAINER_ID: which NRI plugin changed which field
           of the container (its audit record; run by hand)
  upgrade  [-address CONTAINERD_SOCKET]: the running daemon (of that
           containerd, else every one) re-executes the binary at the path it
           was started from, keeping every container; run after installing
           a new binary there
  -info    print the runtime's features (a containerd RuntimeInfo protobuf)
  configure containerd: add the runtime handler (default name nri-shim) to
           containerd's config.toml (version 2: containerd 1.6, 1.7; version
           3: 2.x; a drop-in where it imports a directory), keeping comments
           and the original; --default makes it the default runtime,
           --systemd-cgroup auto follows the runc handler's driver,
           --containerd-nri disable turns containerd's own NRI off when it
           would serve nri-shim's socket, --as-runc declares it with runc's
           type and --binary as runtime_path (containerd 2.0 to 2.3.3 ask
           only such handlers for features), --dry-run prints the diff
  unconfigure containerd: undo it (the original back byte for byte)

Configuration: $NRI_SHIM_CONFIG, else /etc/nri-shim/config.toml.
";

/// Parses `args` (without argv\[0\]). Flags take one or two dashes and
/// `-flag value` or `-flag=value`; the first non-flag is the action.
/// Whether the action has what it needs is [`Flags::require`]'s to say
/// (`start` may get the rest from containerd's bootstrap parameters).
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Flags, ArgsError> {
    let mut f = Flags::default();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let Some(flag) = a.strip_prefix("--").or_else(|| a.strip_prefix('-')) else {
            if f.action.is_empty() {
                f.action = a;
                continue;
            }
            // `inspect <container-id>`: the id may follow the action.
            if f.action == "inspect" && f.id.is_empty() {
                f.id = a;
                continue;
            }
            return Err(ArgsError::Unexpected(a));
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag.to_string(), None),
        };
        match name.as_str() {
            "debug" => f.debug = inline.as_deref() != Some("false"),
            "v" | "version" => f.version = true,
            "h" | "help" => f.help = true,
            "info" => f.info = inline.as_deref() != Some("false"),
            "namespace" | "address" | "publish-binary" | "id" | "bundle" | "socket" => {
                let value = match inline {
                    Some(v) => v,
                    None => it.next().ok_or_else(|| ArgsError::MissingValue(a.clone()))?,
                };
                match name.as_str() {
                    "namespace" => f.namespace = value,
                    "address" => f.address = value,
                    "publish-binary" => f.publish_binary = value,
                    "id" => f.id = value,
                    "bundle" => f.bundle = Some(PathBuf::from(value)),
                    _ => {} // -socket: the runc shim's; ignored
                }
            }
            _ => return Err(ArgsError::UnknownFlag(a)),
        }
    }
    Ok(f)
}

impl Flags {
    /// Checks that `start` and `delete` have the flags containerd always
    /// passes (`-v`, `-h` and `-info` need none).
    ///
    /// # Errors
    /// [`ArgsError::Missing`] naming the first one missing.
    pub fn require(&self) -> Result<(), ArgsError> {
        let action = match self.action.as_str() {
            "start" => "start",
            "delete" => "delete",
            _ => return Ok(()),
        };
        if self.help || self.version || self.info {
            return Ok(());
        }
        for (flag, value) in [
            ("namespace", &self.namespace),
            ("address", &self.address),
            ("id", &self.id),
        ] {
            if value.is_empty() {
                return Err(ArgsError::Missing { action, flag });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Flags, ArgsError> {
        let f = parse(s.split_whitespace().map(str::to_string))?;
        f.require()?;
        Ok(f)
    }

    #[test]
    fn containerd_start_and_delete_lines() {
        let f = p("-namespace default -address /t/c.sock -publish-binary /usr/bin/containerd -id nri1 -debug start")
            .unwrap();
        assert_eq!(
            (
                f.namespace.as_str(),
                f.address.as_str(),
                f.id.as_str(),
                f.debug,
                f.action.as_str()
            ),
            ("default", "/t/c.sock", "nri1", true, "start")
        );
        let f = p("-namespace k8s.io -address /a -publish-binary /b -id c1 -bundle /run/x/c1 delete").unwrap();
        assert_eq!(f.bundle, Some(PathBuf::from("/run/x/c1")));
        assert_eq!(f.action, "delete");
        assert!(!f.debug);
        let f = p("--namespace=ns --id=x daemon").unwrap();
        assert_eq!(
            (f.namespace.as_str(), f.id.as_str(), f.action.as_str()),
            ("ns", "x", "daemon")
        );
    }

    #[test]
    fn inspect_takes_the_container_id_after_the_action() {
        let f = p("-namespace k8s.io inspect c1").unwrap();
        assert_eq!(
            (f.action.as_str(), f.id.as_str(), f.namespace.as_str()),
            ("inspect", "c1", "k8s.io")
        );
        let f = p("inspect c1 -namespace default").unwrap();
        assert_eq!((f.id.as_str(), f.namespace.as_str()), ("c1", "default"));
        assert_eq!(p("inspect c1 c2").unwrap_err(), ArgsError::Unexpected("c2".into()));
    }

    #[test]
    fn bad_lines() {
        assert_eq!(p("-id").unwrap_err(), ArgsError::MissingValue("-id".into()));
        assert_eq!(p("-bogus start").unwrap_err(), ArgsError::UnknownFlag("-bogus".into()));
        assert_eq!(p("start delete").unwrap_err(), ArgsError::Unexpected("delete".into()));
        assert_eq!(
            p("start").unwrap_err(),
            ArgsError::Missing {
                action: "start",
                flag: "namespace"
            }
        );
        assert_eq!(
            p("-namespace n -address /a delete").unwrap_err().to_string(),
            "delete needs -id (containerd passes it)"
        );
        assert_eq!(
            p("-namespace n -id x start").unwrap_err(),
            ArgsError::Missing {
                action: "start",
                flag: "address"
            }
        );
        assert!(p("-v").unwrap().version);
        assert!(p("-info").unwrap().info && p("--info").unwrap().info);
        assert!(!p("-info=false").unwrap().info);
        assert!(p("--help").unwrap().help && p("-h").unwrap().help);
    }
}
