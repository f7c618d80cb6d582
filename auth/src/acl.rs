//! The ACL engine: rules per user and per role, compiled per connection into a
//! [`Grant`] that answers "may publish to N", "may subscribe to F as group G",
//! "may administer" with one hash lookup once asked.
//!
//! - A resource is an MQTT-style topic name, the one mapping every door shares:
//!   core topic `T` with tag `a/b` is `T/a/b` (no tag: `T`). Rule patterns are MQTT
//!   filters (`+` one level, `#` the rest, including the parent level), with
//!   `${username}` and `${clientid}` replaced when the grant is made.
//! - Publishing to a name needs an allow rule whose pattern matches it.
//!   Subscribing to a filter needs an allow rule whose pattern *covers* it (every
//!   name the filter matches, so `a/#` allows `a/x` and `a/+/y` but not `#`); a
//!   deny rule applies as soon as its pattern *overlaps* the filter.
//! - Consumer groups: a subscribe rule with `groups` applies only to those groups
//!   (exact names, `*`, or a `prefix*`); without, to any group.
//! - Deny wins over allow; nothing matching is a deny (`no_match = deny`).
//! - Internal topics (retry, dead-letter, schedule, transaction, timer and the
//!   other RocketMQ system topics) are never reachable by ordinary users, whatever
//!   the rules say, except that one allowed to consume as group `G` may read
//!   `%RETRY%G` and `%DLQ%G` (an unmodified RocketMQ push consumer subscribes to
//!   its retry topic by itself) and send to `%RETRY%G`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rocketgate_base::sync::lock;
use serde::{Deserialize, Serialize};

/// What a rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Publish,
    Subscribe,
    /// The admin API and the native door's admin requests.
    Admin,
    /// Reading the admin API without changing anything (`GET`s: what the web
    /// dashboard shows); `admin` includes it.
    Monitor,
    /// Every action.
    All,
}

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    Allow,
    Deny,
}

/// One rule as written in the user store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub effect: Effect,
    pub actions: Vec<Action>,
    /// MQTT-style patterns over `topic/tag` names; empty = none (admin rules need none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topics: Vec<String>,
    /// Consumer groups a subscribe rule applies to; empty = any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

impl Rule {
    pub fn allow(actions: &[Action], topics: &[&str]) -> Rule {
        Rule {
            effect: Effect::Allow,
            actions: actions.to_vec(),
            topics: topics.iter().map(|s| s.to_string()).collect(),
            groups: Vec::new(),
        }
    }

    pub fn deny(actions: &[Action], topics: &[&str]) -> Rule {
        Rule {
            effect: Effect::Deny,
            ..Rule::allow(actions, topics)
        }
    }

    fn has(&self, a: Action) -> bool {
        self.actions.iter().any(|x| *x == a || *x == Action::All)
    }
}

/// The topics the broker keeps for itself (mirrors `rocketgate-core`'s
/// `is_system_topic`, which this layer may not import; a unit test there and here
/// name the same topics).
pub fn is_internal_topic(core_topic: &str) -> bool {
    const RESERVED: &[&str] = &[
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "SCHEDULE_TOPIC_XXXX_V2",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "BenchmarkTest",
    ];
    core_topic.starts_with("%RETRY%")
        || core_topic.starts_with("%DLQ%")
        || core_topic.starts_with("rmq_sys_")
        || RESERVED.contains(&core_topic)
}

/// The core topic of an MQTT-style name or filter (its first level).
fn core_of(name: &str) -> &str {
    name.split('/').next().unwrap_or(name)
}

/// True when `filter` (with `+`/`#`) matches the topic name `name`.
pub fn filter_matches(filter: &str, name: &str) -> bool {
    let mut f = filter.split('/');
    let mut n = name.split('/');
    loop {
        match (f.next(), n.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// True when every name `inner` matches is matched by `outer` (both filters).
pub fn filter_covers(outer: &str, inner: &str) -> bool {
    let mut o = outer.split('/');
    let mut i = inner.split('/');
    loop {
        match (o.next(), i.next()) {
            (Some("#"), _) => return true,
            (Some(_), Some("#")) => return false,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b && a != "+" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// True when some name is matched by both filters.
pub fn filters_overlap(a: &str, b: &str) -> bool {
    let mut x = a.split('/');
    let mut y = b.split('/');
    loop {
        match (x.next(), y.next()) {
            (Some("#"), _) | (_, Some("#")) => return true,
            (Some("+"), Some(_)) | (Some(_), Some("+")) => {}
            (Some(p), Some(q)) if p == q => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

fn group_matches(pattern: &str, group: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => group.starts_with(prefix),
        None => pattern == group,
    }
}

/// A rule with its placeholders filled in.
#[derive(Debug, Clone)]
pub struct Compiled {
    effect: Effect,
    publish: bool,
    subscribe: bool,
    admin: bool,
    monitor: bool,
    topics: Vec<String>,
    groups: Vec<String>,
}

impl Compiled {
    fn applies_to_group(&self, group: Option<&str>) -> bool {
        match group {
            None => true,
            Some(g) => self.groups.is_empty() || self.groups.iter().any(|p| group_matches(p, g)),
        }
    }
}

/// What one identity may do: compiled once per connection (or per user, for
/// stateless doors), decisions cached.
#[derive(Debug)]
pub struct Grant {
    /// Shared by every connection of a user when its rules use no `${clientid}`.
    rules: Arc<Vec<Compiled>>,
    /// Auth off, or the internal credential: everything is allowed.
    all: bool,
    /// Decisions made so far. A std lock held for one lookup (uncontended: one
    /// connection's task); cleared when it grows past [`MAX_CACHED`]. Boxed on the
    /// first decision: a grant that allows everything never makes one, and every
    /// idle connection holds a grant (issue #33's memory per connection).
    cache: Mutex<Option<Box<Decisions>>>,
}

const MAX_CACHED: usize = 4096;

/// Decisions by kind; a publish is looked up by `&str`, without an allocation.
#[derive(Debug, Default)]
struct Decisions {
    publish: HashMap<String, bool>,
    /// (consumer group, filter) -> allowed.
    subscribe: HashMap<(Option<String>, String), bool>,
    admin: Option<bool>,
    monitor: Option<bool>,
}

/// Placeholders a rule may use.
#[derive(Debug, Clone, Copy, Default)]
pub struct Placeholders<'a> {
    pub username: &'a str,
    pub clientid: &'a str,
}

impl Grant {
    /// Everything allowed (auth off, or the internal credential).
    pub fn all() -> Grant {
        // One empty rule list for every such grant: an idle connection with auth
        // off then holds no allocation of its own for it (issue #33's memory per
        // connection, `gateways/mqtt/tests/idle_memory.rs`).
        static NO_RULES: std::sync::LazyLock<Arc<Vec<Compiled>>> =
            std::sync::LazyLock::new(Arc::default);
        Grant {
            rules: NO_RULES.clone(),
            all: true,
            cache: Mutex::default(),
        }
    }

    /// A grant over rules compiled before (see [`Grant::compile`]), with a decision
    /// cache of its own.
    pub fn from_compiled(rules: Arc<Vec<Compiled>>) -> Grant {
        Grant {
            rules,
            all: false,
            cache: Mutex::default(),
        }
    }

    /// Compiles `rules` (placeholders filled in), to share between grants.
    pub fn compile<'r>(
        rules: impl IntoIterator<Item = &'r Rule>,
        p: Placeholders<'_>,
    ) -> Arc<Vec<Compiled>> {
        Grant::new(rules, p).rules
    }

    /// True when `rules` name `${clientid}` (their compiled form differs per client).
    pub fn per_client<'r>(rules: impl IntoIterator<Item = &'r Rule>) -> bool {
        rules.into_iter().any(|r| {
            r.topics
                .iter()
                .chain(&r.groups)
                .any(|t| t.contains("${clientid}"))
        })
    }

    /// Compiles `rules` (a user's own, then its roles') for one connection.
    pub fn new<'r>(rules: impl IntoIterator<Item = &'r Rule>, p: Placeholders<'_>) -> Grant {
        let fill = |s: &str| {
            s.replace("${username}", p.username)
                .replace("${clientid}", p.clientid)
        };
        let rules = rules
            .into_iter()
            .map(|r| Compiled {
                effect: r.effect,
                publish: r.has(Action::Publish),
                subscribe: r.has(Action::Subscribe),
                admin: r.has(Action::Admin),
                monitor: r.has(Action::Monitor),
                topics: r.topics.iter().map(|t| fill(t)).collect(),
                groups: r.groups.iter().map(|g| fill(g)).collect(),
            })
            .collect();
        Grant {
            rules: Arc::new(rules),
            all: false,
            cache: Mutex::default(),
        }
    }

    /// `f` on the decision cache, made on first use.
    fn cached<R>(&self, f: impl FnOnce(&mut Decisions) -> R) -> R {
        f(lock(&self.cache).get_or_insert_with(Box::default))
    }

    /// True when everything is allowed.
    pub fn is_all(&self) -> bool {
        self.all
    }

    /// May this identity publish to the MQTT-style `name` (`topic/tag`)?
    pub fn may_publish(&self, name: &str) -> bool {
        if self.all {
            return true;
        }
        if let Some(d) = self.cached(|c| c.publish.get(name).copied()) {
            return d;
        }
        let d = (|| {
            let core = core_of(name);
            if is_internal_topic(core) {
                // Only a consumer's own retry topic (a failed consumption sent back).
                return core
                    .strip_prefix("%RETRY%")
                    .is_some_and(|g| self.owns_group(g));
            }
            self.decide(
                |r| r.publish && r.topics.iter().any(|p| filter_matches(p, name)),
                |r| r.publish && r.topics.iter().any(|p| filter_matches(p, name)),
            )
        })();
        self.cached(|c| {
            if c.publish.len() >= MAX_CACHED {
                c.publish.clear();
            }
            c.publish.insert(name.to_owned(), d);
        });
        d
    }

    /// May this identity subscribe to `filter` (an MQTT filter, or a core topic with
    /// its tag levels), consuming as `group` when there is one?
    pub fn may_subscribe(&self, filter: &str, group: Option<&str>) -> bool {
        if self.all {
            return true;
        }
        let key = (group.map(str::to_owned), filter.to_owned());
        if let Some(d) = self.cached(|c| c.subscribe.get(&key).copied()) {
            return d;
        }
        let d = (|| {
            let core = core_of(filter);
            if is_internal_topic(core) {
                let owner = core
                    .strip_prefix("%RETRY%")
                    .or_else(|| core.strip_prefix("%DLQ%"));
                return match (owner, group) {
                    // The consumer group reading its own retry / dead-letter topic.
                    (Some(g), Some(as_group)) => g == as_group && self.owns_group(g),
                    (Some(g), None) => self.owns_group(g),
                    _ => false,
                };
            }
            if let Some(g) = group
                && !self.may_consume_as(g)
            {
                return false;
            }
            self.decide(
                |r| {
                    r.subscribe
                        && r.applies_to_group(group)
                        && r.topics.iter().any(|p| filter_covers(p, filter))
                },
                |r| {
                    r.subscribe
                        && r.applies_to_group(group)
                        && r.topics.iter().any(|p| filters_overlap(p, filter))
                },
            )
        })();
        self.cached(|c| {
            if c.subscribe.len() >= MAX_CACHED {
                c.subscribe.clear();
            }
            c.subscribe.insert(key, d);
        });
        d
    }

    /// May this identity learn where core topic `topic` lives (a NameServer route
    /// query)? Yes when it may publish or subscribe to some name under it (`topic`
    /// itself or `topic/<tag>`) and no deny rule takes the whole topic from that
    /// action; the internal topics only as [`Grant::owns_group`] allows (a consumer
    /// group's `%RETRY%G` and `%DLQ%G`). Not cached: route queries are rare.
    pub fn may_route(&self, topic: &str) -> bool {
        if self.all {
            return true;
        }
        if topic.is_empty() || topic.contains(['/', '+', '#']) {
            return false;
        }
        if is_internal_topic(topic) {
            return topic
                .strip_prefix("%RETRY%")
                .or_else(|| topic.strip_prefix("%DLQ%"))
                .is_some_and(|g| self.owns_group(g));
        }
        let under = format!("{topic}/#");
        let reach = |act: fn(&Compiled) -> bool| {
            !self.rules.iter().any(|r| {
                r.effect == Effect::Deny
                    && act(r)
                    && r.topics.iter().any(|p| filter_covers(p, &under))
            }) && self.rules.iter().any(|r| {
                r.effect == Effect::Allow
                    && act(r)
                    && r.topics.iter().any(|p| filters_overlap(p, &under))
            })
        };
        reach(|r| r.publish) || reach(|r| r.subscribe)
    }

    /// May this identity consume as consumer group `group` (commit its offsets,
    /// send messages back, read its retry and dead-letter topics)?
    pub fn may_consume_as(&self, group: &str) -> bool {
        if self.all {
            return true;
        }
        let named = |r: &Compiled| {
            r.subscribe && !r.groups.is_empty() && r.groups.iter().any(|p| group_matches(p, group))
        };
        if self
            .rules
            .iter()
            .any(|r| r.effect == Effect::Deny && named(r))
        {
            return false;
        }
        self.rules
            .iter()
            .any(|r| r.effect == Effect::Allow && r.subscribe && r.applies_to_group(Some(group)))
    }

    /// Is this identity allowed to consume as `group` by a rule that names it (a
    /// name, a `prefix*` or `*`)? Only then may it reach the group's retry and
    /// dead-letter topics: a rule without `groups` opens topics, not internal ones.
    pub fn owns_group(&self, group: &str) -> bool {
        if self.all {
            return true;
        }
        let named = |r: &Compiled| {
            r.subscribe && !r.groups.is_empty() && r.groups.iter().any(|p| group_matches(p, group))
        };
        !self
            .rules
            .iter()
            .any(|r| r.effect == Effect::Deny && named(r))
            && self
                .rules
                .iter()
                .any(|r| r.effect == Effect::Allow && named(r))
    }

    /// May this identity use the admin API / admin requests?
    pub fn may_admin(&self) -> bool {
        if self.all {
            return true;
        }
        if let Some(d) = self.cached(|c| c.admin) {
            return d;
        }
        let d = self.decide(|r| r.admin, |r| r.admin);
        self.cached(|c| c.admin = Some(d));
        d
    }

    /// May this identity read the admin API (`admin` or `monitor`)?
    pub fn may_monitor(&self) -> bool {
        if self.may_admin() {
            return true;
        }
        if let Some(d) = self.cached(|c| c.monitor) {
            return d;
        }
        let d = self.decide(|r| r.monitor, |r| r.monitor);
        self.cached(|c| c.monitor = Some(d));
        d
    }

    /// Deny wins; no match is a deny.
    fn decide(
        &self,
        allows: impl Fn(&Compiled) -> bool,
        denies: impl Fn(&Compiled) -> bool,
    ) -> bool {
        if self
            .rules
            .iter()
            .any(|r| r.effect == Effect::Deny && denies(r))
        {
            return false;
        }
        self.rules
            .iter()
            .any(|r| r.effect == Effect::Allow && allows(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;

    fn grant(rules: &[Rule]) -> Grant {
        Grant::new(
            rules,
            Placeholders {
                username: "alice",
                clientid: "dev1",
            },
        )
    }

    #[test]
    fn filters() {
        assert!(filter_matches("a/#", "a"));
        assert!(filter_matches("a/#", "a/x/y"));
        assert!(filter_matches("a/+/c", "a/b/c"));
        assert!(!filter_matches("a/+", "a/b/c"));
        assert!(!filter_matches("a/#", "b/x"));
        assert!(filter_covers("a/#", "a/x"));
        assert!(filter_covers("a/#", "a/+/y"));
        assert!(filter_covers("a/#", "a/#"));
        assert!(!filter_covers("a/#", "#"));
        assert!(!filter_covers("a/+", "a/#"));
        assert!(!filter_covers("a/x", "a/+"));
        assert!(filter_covers("+/x", "a/x"));
        assert!(filters_overlap("#", "secret/x"));
        assert!(filters_overlap("a/+", "+/b"));
        assert!(!filters_overlap("a/x", "a/y"));
    }

    /// The matrix of issue #26 at the engine: a user allowed on `a/#` only.
    #[test]
    fn allowed_on_a_only() {
        let g = grant(&[Rule::allow(&[Publish, Subscribe], &["a/#"])]);
        assert!(g.may_publish("a/x"));
        assert!(!g.may_publish("b/x"));
        assert!(g.may_subscribe("a/x", None));
        assert!(!g.may_subscribe("b/x", None));
        assert!(!g.may_subscribe("#", None));
        assert!(!g.may_publish("%DLQ%g"));
        assert!(
            !g.may_subscribe("%DLQ%g", None),
            "no group named: no dead letters"
        );
        assert!(!g.may_subscribe("%RETRY%g", Some("g")));
        assert!(!g.may_subscribe("SCHEDULE_TOPIC_XXXX", None));
        assert!(!g.may_subscribe("rmq_sys_wheel_timer", None));
        assert!(!g.may_admin());
    }

    /// Route queries: a topic is visible to whoever may publish or subscribe to
    /// some name under it, a group's retry / dead-letter topic to its owner.
    #[test]
    fn routes_follow_the_rules() {
        let g = grant(&[
            Rule::allow(&[Publish], &["a/x"]),
            Rule {
                groups: vec!["g1".into()],
                ..Rule::allow(&[Subscribe], &["c/#"])
            },
            Rule::allow(&[Publish], &["d/#"]),
            Rule::deny(&[Publish], &["d/#"]),
        ]);
        assert!(g.may_route("a"), "one tag of a is enough");
        assert!(g.may_route("c"));
        assert!(!g.may_route("b"));
        assert!(!g.may_route("d"), "the whole topic denied");
        assert!(g.may_route("%RETRY%g1") && g.may_route("%DLQ%g1"));
        assert!(!g.may_route("%RETRY%g2") && !g.may_route("TBW102"));
        assert!(!g.may_route("#") && !g.may_route("a/x") && !g.may_route(""));
        assert!(!grant(&[]).may_route("a"));
        assert!(Grant::all().may_route("anything"));
    }

    #[test]
    fn deny_wins_and_no_match_denies() {
        let g = grant(&[
            Rule::allow(&[All], &["#"]),
            Rule::deny(&[Subscribe], &["secret/#"]),
        ]);
        assert!(g.may_publish("secret/x"));
        assert!(!g.may_subscribe("secret/x", None));
        assert!(
            !g.may_subscribe("#", None),
            "# overlaps the denied secret/#"
        );
        assert!(g.may_subscribe("open/x", None));
        assert!(g.may_admin());
        assert!(!grant(&[]).may_publish("a"));
    }

    #[test]
    fn monitor_reads_the_admin_api_and_admin_includes_it() {
        let m = grant(&[Rule::allow(&[Monitor], &[])]);
        assert!(m.may_monitor());
        assert!(!m.may_admin(), "monitor changes nothing");
        assert!(!m.may_publish("a") && !m.may_subscribe("a", None));
        assert!(grant(&[Rule::allow(&[Admin], &[])]).may_monitor());
        assert!(grant(&[Rule::allow(&[All], &["#"])]).may_monitor());
        assert!(!grant(&[Rule::allow(&[Publish], &["#"])]).may_monitor());
        let denied = grant(&[Rule::allow(&[Monitor], &[]), Rule::deny(&[Monitor], &[])]);
        assert!(!denied.may_monitor());
    }

    #[test]
    fn placeholders() {
        let g = grant(&[Rule::allow(
            &[Publish],
            &["users/${username}/${clientid}/#"],
        )]);
        assert!(g.may_publish("users/alice/dev1/t"));
        assert!(!g.may_publish("users/bob/dev1/t"));
    }

    #[test]
    fn groups_and_their_retry_and_dead_letter_topics() {
        let mut r = Rule::allow(&[Subscribe], &["orders/#"]);
        r.groups = vec!["billing*".into()];
        let g = grant(&[r]);
        assert!(g.may_subscribe("orders", Some("billing-1")));
        assert!(!g.may_subscribe("orders", Some("other")));
        assert!(g.may_subscribe("%RETRY%billing-1", Some("billing-1")));
        assert!(g.may_subscribe("%DLQ%billing-1", None));
        assert!(!g.may_subscribe("%RETRY%other", Some("other")));
        assert!(!g.may_subscribe("%RETRY%billing-1", Some("billing-2")));
        assert!(g.may_publish("%RETRY%billing-1"));
        assert!(!g.may_publish("%DLQ%billing-1"));
    }

    #[test]
    fn internal_topics_match_the_cores_list() {
        for t in [
            "%RETRY%g",
            "%DLQ%g",
            "SCHEDULE_TOPIC_XXXX",
            "RMQ_SYS_TRANS_HALF_TOPIC",
            "RMQ_SYS_TRANS_OP_HALF_TOPIC",
            "rmq_sys_wheel_timer",
            "TBW102",
        ] {
            assert!(is_internal_topic(t), "{t}");
        }
        assert!(!is_internal_topic("%MQTT%x"));
        assert!(!is_internal_topic("orders"));
    }
}
