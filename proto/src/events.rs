//! Event subscription masks (NRI `pkg/api/event.go`).
//!
//! A plugin subscribes by answering Configure with a mask where event `e` is
//! bit `e - 1`: RunPodSandbox = `0x1`, CreateContainer = `0x8`,
//! ValidateContainerAdjustment = `0x2000`. The runtime treats a mask of 0 as
//! "every event", validation included, and refuses bits outside
//! [`EventMask::VALID`].

use crate::api::Event;

/// The lifecycle events a runtime dispatches, in protocol order
/// (`RUN_POD_SANDBOX` .. `VALIDATE_CONTAINER_ADJUSTMENT`).
pub const ALL_EVENTS: [Event; 14] = [
    Event::RUN_POD_SANDBOX,
    Event::STOP_POD_SANDBOX,
    Event::REMOVE_POD_SANDBOX,
    Event::CREATE_CONTAINER,
    Event::POST_CREATE_CONTAINER,
    Event::START_CONTAINER,
    Event::POST_START_CONTAINER,
    Event::UPDATE_CONTAINER,
    Event::POST_UPDATE_CONTAINER,
    Event::STOP_CONTAINER,
    Event::REMOVE_CONTAINER,
    Event::UPDATE_POD_SANDBOX,
    Event::POST_UPDATE_POD_SANDBOX,
    Event::VALIDATE_CONTAINER_ADJUSTMENT,
];

/// Why a mask or an event name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// Bits outside [`EventMask::VALID`] were set.
    #[error("invalid plugin events: unknown bits 0x{unknown:x} in mask 0x{mask:x}")]
    UnknownBits {
        /// The full mask received.
        mask: i32,
        /// The bits this runtime does not know.
        unknown: i32,
    },
    /// An event name that [`EventMask::parse`] does not know.
    #[error("unknown event name {0:?}")]
    UnknownName(String),
}

/// A set of subscribed events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EventMask(i32);

impl EventMask {
    /// Every event this protocol version knows: `(1 << (LAST - 1)) - 1` = `0x3fff`.
    pub const VALID: EventMask = EventMask((1 << (Event::LAST as i32 - 1)) - 1);
    /// Pod sandbox events.
    pub const POD: EventMask = EventMask(0x1 | 0x2 | 0x4 | 0x800 | 0x1000);
    /// Container events (validation excluded).
    pub const CONTAINER: EventMask = EventMask(0x8 | 0x10 | 0x20 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400);

    /// The bit of one event; `UNKNOWN` and `LAST` have none.
    pub const fn bit(event: Event) -> i32 {
        let e = event as i32;
        if e <= 0 || e >= Event::LAST as i32 {
            0
        } else {
            1 << (e - 1)
        }
    }

    /// The mask holding exactly `events`.
    pub fn from_events(events: &[Event]) -> EventMask {
        EventMask(events.iter().fold(0, |m, e| m | Self::bit(*e)))
    }

    /// Interprets the `events` field of a ConfigureResponse the way the
    /// runtime must: 0 means every valid event, unknown bits are an error.
    ///
    /// ```
    /// use nri_proto::events::EventMask;
    /// assert_eq!(EventMask::from_configure(0).unwrap(), EventMask::VALID);
    /// assert!(EventMask::from_configure(0x4000).is_err());
    /// ```
    pub fn from_configure(events: i32) -> Result<EventMask, EventError> {
        if events == 0 {
            return Ok(Self::VALID);
        }
        let unknown = events & !Self::VALID.0;
        if unknown != 0 {
            return Err(EventError::UnknownBits { mask: events, unknown });
        }
        Ok(EventMask(events))
    }

    /// The raw bits.
    pub const fn bits(self) -> i32 {
        self.0
    }

    /// A mask from raw bits, unchecked.
    pub const fn from_bits(bits: i32) -> EventMask {
        EventMask(bits)
    }

    /// Whether `event` is in the mask.
    pub const fn is_set(self, event: Event) -> bool {
        self.0 & Self::bit(event) != 0
    }

    /// Adds `event`.
    pub fn set(&mut self, event: Event) {
        self.0 |= Self::bit(event);
    }

    /// The union of two masks.
    pub const fn union(self, other: EventMask) -> EventMask {
        EventMask(self.0 | other.0)
    }

    /// The events in the mask, in protocol order.
    pub fn events(self) -> impl Iterator<Item = Event> {
        ALL_EVENTS.into_iter().filter(move |e| self.is_set(*e))
    }

    /// Parses a comma-separated list of event names, case-insensitive, with
    /// or without underscores: `runpodsandbox`, `create_container`, ..., and
    /// the groups `pod`, `container`, `all`, `validate`.
    ///
    /// ```
    /// use nri_proto::{api::Event, events::EventMask};
    /// let m = EventMask::parse("CreateContainer,stop_container").unwrap();
    /// assert!(m.is_set(Event::CREATE_CONTAINER) && m.is_set(Event::STOP_CONTAINER));
    /// assert_eq!(EventMask::parse("all").unwrap(), EventMask::VALID);
    /// ```
    pub fn parse(names: &str) -> Result<EventMask, EventError> {
        let mut mask = EventMask(0);
        for raw in names.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let key: String = raw
                .chars()
                .filter(|c| *c != '_' && *c != '-')
                .flat_map(char::to_lowercase)
                .collect();
            let add = match key.as_str() {
                "all" => Self::VALID,
                "pod" | "podsandbox" => Self::POD,
                "container" => Self::CONTAINER,
                "validate" | "validation" => EventMask::from_events(&[Event::VALIDATE_CONTAINER_ADJUSTMENT]),
                _ => match ALL_EVENTS.iter().find(|e| event_key(**e) == key) {
                    Some(e) => EventMask(Self::bit(*e)),
                    None => return Err(EventError::UnknownName(raw.to_string())),
                },
            };
            mask = mask.union(add);
        }
        Ok(mask)
    }
}

/// The display name of an event as used in logs and metrics, e.g.
/// `"CreateContainer"`.
pub fn event_name(event: Event) -> &'static str {
    match event {
        Event::UNKNOWN => "Unknown",
        Event::RUN_POD_SANDBOX => "RunPodSandbox",
        Event::STOP_POD_SANDBOX => "StopPodSandbox",
        Event::REMOVE_POD_SANDBOX => "RemovePodSandbox",
        Event::CREATE_CONTAINER => "CreateContainer",
        Event::POST_CREATE_CONTAINER => "PostCreateContainer",
        Event::START_CONTAINER => "StartContainer",
        Event::POST_START_CONTAINER => "PostStartContainer",
        Event::UPDATE_CONTAINER => "UpdateContainer",
        Event::POST_UPDATE_CONTAINER => "PostUpdateContainer",
        Event::STOP_CONTAINER => "StopContainer",
        Event::REMOVE_CONTAINER => "RemoveContainer",
        Event::UPDATE_POD_SANDBOX => "UpdatePodSandbox",
        Event::POST_UPDATE_POD_SANDBOX => "PostUpdatePodSandbox",
        Event::VALIDATE_CONTAINER_ADJUSTMENT => "ValidateContainerAdjustment",
        Event::LAST => "Last",
    }
}

fn event_key(event: Event) -> String {
    event_name(event).to_lowercase()
}

impl std::fmt::Display for EventMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.events().map(event_name).collect();
        write!(f, "{}", names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_follow_event_numbers() {
        assert_eq!(EventMask::bit(Event::RUN_POD_SANDBOX), 0x1);
        assert_eq!(EventMask::bit(Event::CREATE_CONTAINER), 0x8);
        assert_eq!(EventMask::bit(Event::VALIDATE_CONTAINER_ADJUSTMENT), 0x2000);
        assert_eq!(EventMask::bit(Event::UNKNOWN), 0);
        assert_eq!(EventMask::bit(Event::LAST), 0);
        assert_eq!(EventMask::VALID.bits(), 0x3fff);
        assert_eq!(EventMask::from_events(&ALL_EVENTS), EventMask::VALID);
        assert_eq!(EventMask::POD.union(EventMask::CONTAINER).bits(), 0x1fff);
    }

    #[test]
    fn configure_mask_rules() {
        assert_eq!(EventMask::from_configure(0).unwrap(), EventMask::VALID);
        assert!(
            EventMask::from_configure(0)
                .unwrap()
                .is_set(Event::VALIDATE_CONTAINER_ADJUSTMENT)
        );
        assert_eq!(EventMask::from_configure(0x8).unwrap().bits(), 0x8);
        assert_eq!(
            EventMask::from_configure(0x4008),
            Err(EventError::UnknownBits {
                mask: 0x4008,
                unknown: 0x4000
            })
        );
        assert!(EventMask::from_configure(-1).is_err());
    }

    #[test]
    fn parse_names() {
        let m = EventMask::parse("runpodsandbox, CreateContainer,post-start-container").unwrap();
        assert_eq!(m.bits(), 0x1 | 0x8 | 0x40);
        assert_eq!(EventMask::parse("pod").unwrap(), EventMask::POD);
        assert!(EventMask::parse("bogus").is_err());
        assert_eq!(EventMask::parse("").unwrap().bits(), 0);
        assert_eq!(m.to_string(), "RunPodSandbox,CreateContainer,PostStartContainer");
    }
}
