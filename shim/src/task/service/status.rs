//! The lifecycle state of one process (init or exec) and its legal
//! transitions.
//!
//! ```text
//! Created --start--> Starting --started--> Running <--pause/resume--> Paused
//!    |                   |                    |                          |
//!    |             start_failed               +---------- exit ----------+
//!    |                   v                    v
//!    +------ exit -----> Stopped <------------+           --delete--> (gone)
//! ```
//!
//! Each transition is a function of the current state. An operation the
//! state does not allow is an [`Illegal`] error, which the service turns
//! into `FailedPrecondition` (start twice, pause a stopped task) or
//! `NotFound` (signal a finished process: what CRI's stop path expects,
//! containerd #6665). Transitions that race an exit (`started`,
//! `start_failed`, `thaw`) never undo a `Stopped` the exit watcher set.

use std::sync::Mutex;

use containerd_shim_protos::api as task_api;

use crate::{error::ShimError, sync::lock};

/// Lifecycle state of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Created, not started.
    Created,
    /// Start in progress.
    Starting,
    /// Running.
    Running,
    /// Frozen.
    Paused,
    /// Exited (or failed to start).
    Stopped,
}

/// An operation the process's state does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Illegal {
    /// The state the process was in.
    pub from: Status,
    /// What was refused, as a verb phrase ("start", "pause", "exec in").
    pub op: &'static str,
}

impl Illegal {
    /// The shim error for `what` (e.g. "task c1", "exec e1 of task c1"):
    /// `NotFound` for a signal to a finished process, else
    /// `FailedPrecondition`.
    pub fn into_error(self, what: &str) -> ShimError {
        let text = match (self.op, self.from) {
            // runc's wording, which containerd users know.
            ("exec in", Status::Paused) => format!("cannot exec in a paused state: {what} is paused"),
            ("signal", Status::Stopped) => return ShimError::NotFound(format!("{what} has already finished")),
            (op, from) => format!("cannot {op} {what}: it is {}", from.name()),
        };
        ShimError::FailedPrecondition(text)
    }
}

impl Status {
    /// Every status, in lifecycle order.
    pub const ALL: [Status; 5] = [
        Status::Created,
        Status::Starting,
        Status::Running,
        Status::Paused,
        Status::Stopped,
    ];

    /// Lower-case name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Starting => "starting",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Stopped => "stopped",
        }
    }

    /// The status containerd sees (`Starting` counts as running).
    pub fn to_proto(self) -> task_api::Status {
        match self {
            Status::Created => task_api::Status::CREATED,
            Status::Starting | Status::Running => task_api::Status::RUNNING,
            Status::Paused => task_api::Status::PAUSED,
            Status::Stopped => task_api::Status::STOPPED,
        }
    }

    fn illegal(self, op: &'static str) -> Illegal {
        Illegal { from: self, op }
    }

    /// Start begins: only a created process.
    pub fn start(self) -> Result<Status, Illegal> {
        match self {
            Status::Created => Ok(Status::Starting),
            s => Err(s.illegal("start")),
        }
    }

    /// Start succeeded. A process that exited meanwhile stays stopped.
    pub fn started(self) -> Status {
        match self {
            Status::Starting => Status::Running,
            s => s,
        }
    }

    /// Start failed: stopped (runc: a process that could not start can
    /// be deleted). One that already exited stays as it is.
    pub fn start_failed(self) -> Status {
        match self {
            Status::Starting => Status::Stopped,
            s => s,
        }
    }

    /// Freeze: only a running process.
    pub fn pause(self) -> Result<Status, Illegal> {
        match self {
            Status::Running => Ok(Status::Paused),
            s => Err(s.illegal("pause")),
        }
    }

    /// Thaw: only a paused process.
    pub fn resume(self) -> Result<Status, Illegal> {
        match self {
            Status::Paused => Ok(Status::Running),
            s => Err(s.illegal("resume")),
        }
    }

    /// Thawed for a SIGKILL (a frozen task cannot die): running again
    /// until its exit is reaped. Any other state is kept.
    pub fn thaw(self) -> Status {
        match self {
            Status::Paused => Status::Running,
            s => s,
        }
    }

    /// The process exited (from any state).
    pub fn exit(self) -> Status {
        Status::Stopped
    }

    /// May the process be signalled? Not once it finished.
    pub fn signal(self) -> Result<(), Illegal> {
        match self {
            Status::Stopped => Err(self.illegal("signal")),
            _ => Ok(()),
        }
    }

    /// May the process (for the init: the task) be deleted? Only when it
    /// finished or never started.
    pub fn delete(self) -> Result<(), Illegal> {
        match self {
            Status::Stopped | Status::Created => Ok(()),
            s => Err(s.illegal("delete")),
        }
    }

    /// May a process be exec'd into a task whose init is in this state?
    /// Not into a frozen cgroup (joining it would block until a resume)
    /// nor a stopped one.
    pub fn exec_into(self) -> Result<(), Illegal> {
        match self {
            Status::Paused | Status::Stopped => Err(self.illegal("exec in")),
            _ => Ok(()),
        }
    }
}

/// A process's status behind a lock, changed only through [`Status`]'s
/// transitions.
#[derive(Debug)]
pub struct StatusCell(Mutex<Status>);

impl Default for StatusCell {
    fn default() -> Self {
        StatusCell(Mutex::new(Status::Created))
    }
}

impl StatusCell {
    /// The current status.
    pub fn get(&self) -> Status {
        *lock(&self.0)
    }

    /// Applies a fallible transition atomically; returns the status before.
    pub fn apply(&self, f: impl FnOnce(Status) -> Result<Status, Illegal>) -> Result<Status, Illegal> {
        let mut s = lock(&self.0);
        let before = *s;
        *s = f(before)?;
        Ok(before)
    }

    /// Applies an infallible transition; returns the status before.
    pub fn update(&self, f: impl FnOnce(Status) -> Status) -> Status {
        let mut s = lock(&self.0);
        let before = *s;
        *s = f(before);
        before
    }

    /// Applies `f` only if the status is still `expected` (the state may
    /// have moved while a freeze was in progress); returns the status found.
    pub fn update_if(&self, expected: Status, f: impl FnOnce(Status) -> Result<Status, Illegal>) -> Status {
        let mut s = lock(&self.0);
        let now = *s;
        if now == expected
            && let Ok(next) = f(now)
        {
            *s = next;
        }
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Status::*;

    const ALL: [Status; 5] = [Created, Starting, Running, Paused, Stopped];

    /// Every fallible transition from every state: the legal ones and
    /// their target, everything else refused.
    #[test]
    fn fallible_transitions_from_every_state() {
        type Transition = fn(Status) -> Result<Status, Illegal>;
        type Legal = &'static [(Status, Status)];
        let table: [(&str, Transition, Legal); 3] = [
            ("start", Status::start, &[(Created, Starting)]),
            ("pause", Status::pause, &[(Running, Paused)]),
            ("resume", Status::resume, &[(Paused, Running)]),
        ];
        for (op, f, legal) in table {
            for s in ALL {
                match legal.iter().find(|(from, _)| *from == s) {
                    Some((_, to)) => assert_eq!(f(s), Ok(*to), "{op} from {s:?}"),
                    None => assert_eq!(f(s), Err(Illegal { from: s, op }), "{op} from {s:?}"),
                }
            }
        }
    }

    #[test]
    fn infallible_transitions_never_leave_stopped() {
        for s in ALL {
            assert_eq!(s.exit(), Stopped);
            assert_eq!(s.started(), if s == Starting { Running } else { s });
            assert_eq!(s.start_failed(), if s == Starting { Stopped } else { s });
            assert_eq!(s.thaw(), if s == Paused { Running } else { s });
        }
    }

    #[test]
    fn checks_from_every_state() {
        for s in ALL {
            assert_eq!(s.signal().is_ok(), s != Stopped, "signal {s:?}");
            assert_eq!(s.delete().is_ok(), matches!(s, Stopped | Created), "delete {s:?}");
            assert_eq!(s.exec_into().is_ok(), !matches!(s, Paused | Stopped), "exec {s:?}");
        }
    }

    #[test]
    fn refusals_map_to_the_codes_containerd_acts_on() {
        let code = |e: Illegal| e.into_error("task c1").code();
        assert_eq!(code(Stopped.signal().unwrap_err()), ttrpc::Code::NOT_FOUND);
        for e in [
            Running.start().unwrap_err(),
            Stopped.pause().unwrap_err(),
            Running.resume().unwrap_err(),
            Running.delete().unwrap_err(),
            Paused.exec_into().unwrap_err(),
        ] {
            assert_eq!(code(e), ttrpc::Code::FAILED_PRECONDITION, "{e:?}");
        }
        assert_eq!(
            Paused.exec_into().unwrap_err().into_error("task c1").to_string(),
            "cannot exec in a paused state: task c1 is paused"
        );
        assert_eq!(
            Running.delete().unwrap_err().into_error("task c1").to_string(),
            "cannot delete task c1: it is running"
        );
        assert_eq!(
            Stopped
                .signal()
                .unwrap_err()
                .into_error("exec e of task c1")
                .to_string(),
            "exec e of task c1 has already finished"
        );
    }

    #[test]
    fn cell_applies_only_legal_transitions() {
        let c = StatusCell::default();
        assert_eq!(c.apply(Status::start), Ok(Created));
        assert_eq!(
            c.apply(Status::start),
            Err(Illegal {
                from: Starting,
                op: "start"
            })
        );
        assert_eq!(c.update(Status::started), Starting);
        assert_eq!(c.get(), Running);
        // A pause whose freeze raced an exit: the exit's Stopped is kept.
        c.update(Status::exit);
        assert_eq!(c.update_if(Running, Status::pause), Stopped);
        assert_eq!(c.get(), Stopped);
    }
}
