//! Delay levels, retry back-off and the names of system topics — the fixed tables
//! the broker consults when it schedules, retries or dead-letters a message.
//!
//! Pure values and functions only. The scheduler that actually holds delayed
//! messages lives with the store; this module answers "how long is level 5?",
//! "what happens after the 7th failure?" and "may a user create topic X?".
//!
//! Delivery at an arbitrary time (not one of the levels) is deliberately not
//! expressed as "the smallest level ≥ the delay": rounding a requested time up to
//! a level would deliver late by up to an hour. Such messages go to the timer
//! store (`rmq_sys_wheel_timer`) with their exact time instead.

use std::fmt;
use std::time::Duration;

pub use crate::error::{DelayLevelsError, InvalidName};

// ---------------------------------------------------------------------------
// Delay levels
// ---------------------------------------------------------------------------

/// RocketMQ's `messageDelayLevel` default: levels 1..=18.
pub const DEFAULT_DELAY_LEVELS: &str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h";

/// More levels than anyone configures; a bound so a config typo cannot allocate
/// without limit.
pub const MAX_DELAY_LEVELS: usize = 256;

/// A table of delay levels, level `n` (1-based) being the `n`-th entry. Level 0
/// means "not delayed".
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DelayLevels {
    delays: Vec<Duration>,
}

impl Default for DelayLevels {
    fn default() -> Self {
        DelayLevels::parse(DEFAULT_DELAY_LEVELS).expect("the built-in delay levels parse")
    }
}

impl DelayLevels {
    /// Parses RocketMQ's format: whitespace-separated durations, each a positive
    /// integer with unit `s`, `m`, `h` or `d` (case-insensitive).
    pub fn parse(s: &str) -> Result<Self, DelayLevelsError> {
        let mut delays = Vec::new();
        for (i, text) in s.split_whitespace().enumerate() {
            let level = i + 1;
            if level > MAX_DELAY_LEVELS {
                return Err(DelayLevelsError::TooMany {
                    count: s.split_whitespace().count(),
                });
            }
            let bad = || DelayLevelsError::BadLevel {
                level,
                text: text.to_owned(),
            };
            let unit_at = text.len().checked_sub(1).ok_or_else(bad)?;
            if !text.is_char_boundary(unit_at) {
                return Err(bad());
            }
            let (digits, unit) = text.split_at(unit_at);
            let secs_per_unit: u64 = match unit {
                "s" | "S" => 1,
                "m" | "M" => 60,
                "h" | "H" => 3_600,
                "d" | "D" => 86_400,
                _ => return Err(bad()),
            };
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let n: u64 = digits.parse().map_err(|_| bad())?;
            let secs = n.checked_mul(secs_per_unit).ok_or_else(bad)?;
            if secs == 0 {
                return Err(bad());
            }
            delays.push(Duration::from_secs(secs));
        }
        if delays.is_empty() {
            return Err(DelayLevelsError::Empty);
        }
        Ok(DelayLevels { delays })
    }

    /// The delay of `level` (1-based); `None` for 0 ("not delayed") and for
    /// levels past the table.
    pub fn delay_of(&self, level: u32) -> Option<Duration> {
        let i = usize::try_from(level).ok()?.checked_sub(1)?;
        self.delays.get(i).copied()
    }

    /// The highest level (18 with the defaults).
    pub fn max_level(&self) -> u32 {
        u32::try_from(self.delays.len()).unwrap_or(u32::MAX)
    }

    /// The level a message sent with `requested` is stored at: 0 stays 0 (not
    /// delayed) and anything above the table becomes the last level, as the
    /// RocketMQ broker does on send.
    pub fn effective_level(&self, requested: u32) -> u32 {
        requested.min(self.max_level())
    }

    /// `(level, delay)` for every level, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, Duration)> + '_ {
        (1..).zip(self.delays.iter().copied())
    }

    /// What to do with a message whose consumption failed (or whose POP
    /// invisibility expired) after it had already been redelivered
    /// `reconsume_times` times (0 on the first failure).
    ///
    /// RocketMQ's rule: at `reconsume_times >= max_reconsume_times` the message
    /// goes to `%DLQ%<group>`; otherwise to `%RETRY%<group>` at delay level
    /// `3 + reconsume_times` (10s, 30s, 1m, ... 2h with the default table),
    /// capped at the last level. With the default maximum of 16 a message is
    /// delivered 17 times in all: once, then 16 retries.
    pub fn next_retry(&self, reconsume_times: u32, max_reconsume_times: u32) -> RetryDecision {
        if reconsume_times >= max_reconsume_times {
            return RetryDecision::DeadLetter;
        }
        let level = self.effective_level(RETRY_FIRST_DELAY_LEVEL.saturating_add(reconsume_times));
        RetryDecision::Retry {
            delay_level: level,
            delay: self
                .delay_of(level)
                .expect("an effective level is in the table"),
        }
    }
}

impl fmt::Display for DelayLevels {
    /// Back in the configuration format, largest exact unit per level.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.delays.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            let s = d.as_secs();
            match () {
                _ if s % 86_400 == 0 => write!(f, "{}d", s / 86_400)?,
                _ if s % 3_600 == 0 => write!(f, "{}h", s / 3_600)?,
                _ if s % 60 == 0 => write!(f, "{}m", s / 60)?,
                _ => write!(f, "{s}s")?,
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Retry back-off
// ---------------------------------------------------------------------------

/// RocketMQ's default `maxReconsumeTimes`.
pub const DEFAULT_MAX_RECONSUME_TIMES: u32 = 16;

/// The delay level of the first retry (10 s with the default table); retry `n`
/// (0-based) uses level `RETRY_FIRST_DELAY_LEVEL + n`.
pub const RETRY_FIRST_DELAY_LEVEL: u32 = 3;

/// The outcome of a failed consumption.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RetryDecision {
    /// Send to `%RETRY%<group>`, delivered again after `delay`.
    Retry { delay_level: u32, delay: Duration },
    /// Out of attempts: send to `%DLQ%<group>`.
    DeadLetter,
}

/// [`DelayLevels::next_retry`] on the default delay table.
pub fn next_retry(reconsume_times: u32, max_reconsume_times: u32) -> RetryDecision {
    DelayLevels::default().next_retry(reconsume_times, max_reconsume_times)
}

// ---------------------------------------------------------------------------
// System topics and name validation
// ---------------------------------------------------------------------------

/// Prefix of a consumer group's retry topic.
pub const RETRY_TOPIC_PREFIX: &str = "%RETRY%";
/// Prefix of a consumer group's dead-letter topic.
pub const DLQ_TOPIC_PREFIX: &str = "%DLQ%";
/// Where level-delayed messages wait (one queue per level, queue id = level - 1).
pub const SCHEDULE_TOPIC: &str = "SCHEDULE_TOPIC_XXXX";
/// Where transactional half messages wait for commit or rollback.
pub const TRANS_HALF_TOPIC: &str = "RMQ_SYS_TRANS_HALF_TOPIC";
/// Where commit/rollback decisions on half messages are recorded.
pub const TRANS_OP_HALF_TOPIC: &str = "RMQ_SYS_TRANS_OP_HALF_TOPIC";
/// Where messages with an arbitrary delivery time wait (RocketMQ 5 timer store).
pub const TIMER_TOPIC: &str = "rmq_sys_wheel_timer";
/// Every topic starting with this is the broker's own (RocketMQ's rule).
pub const SYSTEM_TOPIC_PREFIX: &str = "rmq_sys_";
/// System topics a door keeps its own state in (the MQTT door's sessions and
/// retained messages: `rmq_sys_rg_door_mqtt_state`, ...). Unlike the broker's
/// other system topics they are created through
/// [`MessagingApi::create_topic`](super::MessagingApi::create_topic), so a door
/// over a remote broker (a proxy) can create them; they are still system topics
/// (not listed as user topics, not auto-created by a send).
pub const DOOR_STATE_TOPIC_PREFIX: &str = "rmq_sys_rg_door_";
/// The template topic RocketMQ routes auto-created topics through.
pub const AUTO_CREATE_TOPIC: &str = "TBW102";

/// Topic names RocketMQ reserves besides the prefixes above.
const RESERVED_TOPICS: &[&str] = &[
    AUTO_CREATE_TOPIC,
    SCHEDULE_TOPIC,
    "SCHEDULE_TOPIC_XXXX_V2",
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "RMQ_SYS_TRACE_TOPIC",
    "SELF_TEST_TOPIC",
    "OFFSET_MOVED_EVENT",
    "BenchmarkTest",
];

/// Reserved topics that producers may not send to: the broker writes them itself.
const SEND_FORBIDDEN_TOPICS: &[&str] = &[
    // Only a route: a send naming it directly would store messages nobody reads.
    AUTO_CREATE_TOPIC,
    SCHEDULE_TOPIC,
    "SCHEDULE_TOPIC_XXXX_V2",
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC",
    "OFFSET_MOVED_EVENT",
];

/// RocketMQ's topic length limit.
pub const MAX_TOPIC_LEN: usize = 127;
/// RocketMQ's consumer/producer group length limit.
pub const MAX_GROUP_LEN: usize = 255;

/// `%RETRY%<group>`.
pub fn retry_topic(group: &str) -> String {
    format!("{RETRY_TOPIC_PREFIX}{group}")
}

/// `%DLQ%<group>`.
pub fn dlq_topic(group: &str) -> String {
    format!("{DLQ_TOPIC_PREFIX}{group}")
}

/// The group of a retry topic, `None` if `topic` is not one.
pub fn retry_topic_group(topic: &str) -> Option<&str> {
    topic.strip_prefix(RETRY_TOPIC_PREFIX)
}

/// The group of a dead-letter topic, `None` if `topic` is not one.
pub fn dlq_topic_group(topic: &str) -> Option<&str> {
    topic.strip_prefix(DLQ_TOPIC_PREFIX)
}

/// True for every topic the broker owns: retry and dead-letter topics, the
/// schedule, timer and transaction topics, RocketMQ's other reserved names and
/// anything starting with `rmq_sys_`. Users cannot create these, and they are kept
/// apart from user topics in listings.
pub fn is_system_topic(topic: &str) -> bool {
    topic.starts_with(RETRY_TOPIC_PREFIX)
        || topic.starts_with(DLQ_TOPIC_PREFIX)
        || topic.starts_with(SYSTEM_TOPIC_PREFIX)
        || RESERVED_TOPICS.contains(&topic)
}

/// True for the system topics no producer may send to (retry and DLQ topics are
/// writable: consumers send messages back to them, and DLQ messages are re-sent).
pub fn is_send_forbidden(topic: &str) -> bool {
    SEND_FORBIDDEN_TOPICS.contains(&topic) || topic == TIMER_TOPIC
}

fn validate_name(what: &'static str, name: &str, max: usize) -> Result<(), InvalidName> {
    if name.trim().is_empty() {
        return Err(InvalidName::Empty { what });
    }
    // RocketMQ checks characters first; report the first bad one with its place.
    if let Some((i, ch)) = name
        .chars()
        .enumerate()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '_' | '-')))
    {
        return Err(InvalidName::IllegalChar {
            what,
            name: name.to_owned(),
            ch,
            position: i + 1,
        });
    }
    if name.len() > max {
        return Err(InvalidName::TooLong {
            what,
            len: name.len(),
            max,
        });
    }
    Ok(())
}

/// Checks a topic name against RocketMQ's rule `^[%|a-zA-Z0-9_-]+$`, at most 127
/// characters. Says nothing about reservation; see [`validate_user_topic`].
pub fn validate_topic(topic: &str) -> Result<(), InvalidName> {
    validate_name("topic", topic, MAX_TOPIC_LEN)
}

/// [`validate_topic`], and the topic is not a system topic: what a user may create
/// (or auto-create by sending).
/// True for a door-state topic name (see [`DOOR_STATE_TOPIC_PREFIX`]).
pub fn is_door_state_topic(topic: &str) -> bool {
    topic.starts_with(DOOR_STATE_TOPIC_PREFIX) && topic.len() > DOOR_STATE_TOPIC_PREFIX.len()
}

pub fn validate_user_topic(topic: &str) -> Result<(), InvalidName> {
    validate_topic(topic)?;
    if is_system_topic(topic) {
        return Err(InvalidName::Reserved(topic.to_owned()));
    }
    Ok(())
}

/// Checks a consumer or producer group name: same characters as a topic, at most
/// 255 characters.
pub fn validate_group(group: &str) -> Result<(), InvalidName> {
    validate_name("group", group, MAX_GROUP_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1;
    const M: u64 = 60;
    const H: u64 = 3600;

    #[test]
    fn default_levels_are_rocketmqs() {
        let levels = DelayLevels::default();
        let want = [
            S,
            5 * S,
            10 * S,
            30 * S,
            M,
            2 * M,
            3 * M,
            4 * M,
            5 * M,
            6 * M,
            7 * M,
            8 * M,
            9 * M,
            10 * M,
            20 * M,
            30 * M,
            H,
            2 * H,
        ];
        assert_eq!(levels.max_level(), 18);
        for (i, secs) in want.iter().enumerate() {
            let level = u32::try_from(i).unwrap() + 1;
            assert_eq!(levels.delay_of(level), Some(Duration::from_secs(*secs)));
        }
        assert_eq!(levels.delay_of(0), None);
        assert_eq!(levels.delay_of(19), None);
        assert_eq!(levels.delay_of(u32::MAX), None);
        assert_eq!(levels.to_string(), DEFAULT_DELAY_LEVELS);
        assert_eq!(levels.iter().count(), 18);
    }

    #[test]
    fn level_errors_quote_the_tables_they_check_against() {
        // The messages live in `crate::error` (below this module), so they spell
        // the default table and the bound out; this keeps them in step.
        let empty = DelayLevels::parse("  ").unwrap_err().to_string();
        assert!(
            empty.contains(&format!("{DEFAULT_DELAY_LEVELS:?}")),
            "{empty}"
        );
        let many = vec!["1s"; MAX_DELAY_LEVELS + 1].join(" ");
        let too_many = DelayLevels::parse(&many).unwrap_err().to_string();
        assert!(
            too_many.ends_with(&format!("the maximum is {MAX_DELAY_LEVELS}")),
            "{too_many}"
        );
    }

    #[test]
    fn effective_level_clamps_like_rocketmq() {
        let levels = DelayLevels::default();
        assert_eq!(levels.effective_level(0), 0);
        assert_eq!(levels.effective_level(7), 7);
        assert_eq!(levels.effective_level(99), 18);
    }

    #[test]
    fn custom_levels_parse() {
        let l = DelayLevels::parse("  1s\t2M 1h  3d ").unwrap();
        assert_eq!(l.max_level(), 4);
        assert_eq!(l.delay_of(2), Some(Duration::from_secs(120)));
        assert_eq!(l.delay_of(4), Some(Duration::from_secs(3 * 86_400)));
        assert_eq!(l.to_string(), "1s 2m 1h 3d");
    }

    #[test]
    fn bad_levels_are_rejected_with_their_place() {
        for (input, want) in [
            ("", DelayLevelsError::Empty),
            ("   ", DelayLevelsError::Empty),
            ("1s 5x", bad(2, "5x")),
            ("1s s", bad(2, "s")),
            ("0s", bad(1, "0s")),
            ("-1s", bad(1, "-1s")),
            ("1.5s", bad(1, "1.5s")),
            ("1", bad(1, "1")),
            ("5秒", bad(1, "5秒")),
            ("99999999999999999999d", bad(1, "99999999999999999999d")),
            ("999999999999999999d", bad(1, "999999999999999999d")),
        ] {
            assert_eq!(DelayLevels::parse(input), Err(want), "{input:?}");
        }
        let many = "1s ".repeat(MAX_DELAY_LEVELS + 1);
        assert!(matches!(
            DelayLevels::parse(&many),
            Err(DelayLevelsError::TooMany { .. })
        ));
    }

    fn bad(level: usize, text: &str) -> DelayLevelsError {
        DelayLevelsError::BadLevel {
            level,
            text: text.to_owned(),
        }
    }

    #[test]
    fn retry_backoff_follows_rocketmq() {
        let want_secs = [
            10,
            30,
            M,
            2 * M,
            3 * M,
            4 * M,
            5 * M,
            6 * M,
            7 * M,
            8 * M,
            9 * M,
            10 * M,
            20 * M,
            30 * M,
            H,
            2 * H,
        ];
        for (n, secs) in want_secs.iter().enumerate() {
            let n = u32::try_from(n).unwrap();
            assert_eq!(
                next_retry(n, DEFAULT_MAX_RECONSUME_TIMES),
                RetryDecision::Retry {
                    delay_level: 3 + n,
                    delay: Duration::from_secs(*secs)
                },
                "reconsume_times={n}"
            );
        }
        assert_eq!(next_retry(16, 16), RetryDecision::DeadLetter);
        assert_eq!(next_retry(0, 0), RetryDecision::DeadLetter);
        // A larger maximum keeps retrying at the last level.
        assert_eq!(
            next_retry(20, 32),
            RetryDecision::Retry {
                delay_level: 18,
                delay: Duration::from_secs(2 * H)
            }
        );
        assert_eq!(
            next_retry(u32::MAX - 1, u32::MAX),
            RetryDecision::Retry {
                delay_level: 18,
                delay: Duration::from_secs(2 * H)
            }
        );
        // A short custom table still yields a valid level.
        let short = DelayLevels::parse("1s 2s").unwrap();
        assert_eq!(
            short.next_retry(0, 16),
            RetryDecision::Retry {
                delay_level: 2,
                delay: Duration::from_secs(2)
            }
        );
    }

    #[test]
    fn system_topics() {
        assert_eq!(retry_topic("g1"), "%RETRY%g1");
        assert_eq!(dlq_topic("g1"), "%DLQ%g1");
        assert_eq!(retry_topic_group("%RETRY%g1"), Some("g1"));
        assert_eq!(dlq_topic_group("%DLQ%g1"), Some("g1"));
        assert_eq!(retry_topic_group("g1"), None);
        for t in [
            "%RETRY%g",
            "%DLQ%g",
            SCHEDULE_TOPIC,
            TRANS_HALF_TOPIC,
            TRANS_OP_HALF_TOPIC,
            TIMER_TOPIC,
            "rmq_sys_anything",
            AUTO_CREATE_TOPIC,
        ] {
            assert!(is_system_topic(t), "{t}");
            assert!(validate_topic(t).is_ok(), "{t}");
            assert!(matches!(
                validate_user_topic(t),
                Err(InvalidName::Reserved(_))
            ));
        }
        for t in ["orders", "RMQ_SYS_other", "sensors"] {
            assert!(!is_system_topic(t), "{t}");
        }
        assert!(is_send_forbidden(SCHEDULE_TOPIC));
        assert!(is_send_forbidden(TRANS_HALF_TOPIC));
        assert!(is_send_forbidden(TIMER_TOPIC));
        assert!(!is_send_forbidden("%RETRY%g"));
        assert!(!is_send_forbidden("orders"));
    }

    #[test]
    fn topic_names_follow_rocketmqs_rule() {
        for ok in ["a", "Topic_1", "a-b|c%d", &"x".repeat(127)] {
            assert_eq!(validate_topic(ok), Ok(()), "{ok}");
        }
        assert_eq!(
            validate_topic(""),
            Err(InvalidName::Empty { what: "topic" })
        );
        assert_eq!(
            validate_topic(&"x".repeat(128)),
            Err(InvalidName::TooLong {
                what: "topic",
                len: 128,
                max: 127
            })
        );
        let e = validate_topic("sensors/room1").unwrap_err();
        assert_eq!(
            e,
            InvalidName::IllegalChar {
                what: "topic",
                name: "sensors/room1".into(),
                ch: '/',
                position: 8
            }
        );
        assert!(e.to_string().contains("'/' at position 8"), "{e}");
        for bad in ["a b", "a.b", "温度", "a\0", "tab\t"] {
            assert!(validate_topic(bad).is_err(), "{bad:?}");
        }
        assert!(validate_group(&"g".repeat(255)).is_ok());
        assert!(validate_group(&"g".repeat(256)).is_err());
    }
}
