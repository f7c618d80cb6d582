//! Authentication and the ACL at the native door: with auth on, every request must
//! carry RocketMQ's signature (`AccessKey`, optional `SecurityToken`, `Signature`
//! over the sorted ext fields and the body; `rocketgate_auth::sign`), checked
//! before it is handled; an unsigned or wrongly signed one, or one the user's grant
//! does not allow, is answered `NO_PERMISSION` with a remark saying why. Over TLS
//! with a verified client certificate and `auth.certificate_identity` on, an
//! unsigned request is the certificate's user instead (mTLS); a signed one is
//! always its signer.
//!
//! What each request needs: sends publish on `topic/tag` (a batch: on `topic`);
//! pulls and offset queries/commits subscribe on the topic as the consumer group;
//! sending a message back and listing a group's consumers consume as the group;
//! offset range queries read the topic; message lookups, topic creation and stats
//! are admin requests; heartbeats, unregistering, client config, queue locks and
//! ending transactions need only a valid signature. The broker API codes
//! (`code::api`, a proxy's calls) need the internal credential.

use std::sync::Arc;

use rocketgate_auth::{Auth, Credentials, Denied, Grant, Identity};
use rocketgate_remoting::body::field;
use rocketgate_remoting::code::{self, request, response};
use rocketgate_remoting::codec::RemotingCommand;

use super::reply::Fail;

/// A connection's last grant: the signature is checked on every request, the
/// grant compiled again only when the signer or the user store changes.
#[derive(Default)]
pub(crate) struct ConnAccess {
    last: Option<(String, u64, Arc<Grant>)>,
    /// The store generation at which the connection's client certificate was last
    /// accepted as its user (logged in once per generation, not per request).
    certificate_ok: Option<u64>,
}

impl ConnAccess {
    /// Checks the request's signature (or the connection's client certificate) and
    /// its permission.
    pub fn authorize(
        &mut self,
        auth: &Auth,
        peer: std::net::IpAddr,
        tls_identity: Option<&str>,
        req: &RemotingCommand,
    ) -> Result<(), Fail> {
        if !auth.enabled() {
            return Ok(());
        }
        let fields: Vec<(&str, &str)> = req.ext_fields.iter().collect();
        let refused = |e: Denied| {
            metrics::counter!("rocketgate_auth_failures_total", "door" => "native").increment(1);
            Fail::new(response::NO_PERMISSION, e.to_string())
        };
        let who = match auth.verify_signed(fields.iter().copied(), &req.body) {
            Ok(who) => who,
            Err(Denied::Unsigned) => match tls_identity {
                Some(name) if auth.settings().certificate_identity => {
                    self.certificate_user(auth, peer, name).map_err(refused)?
                }
                _ => return Err(refused(Denied::Unsigned)),
            },
            Err(e) => return Err(refused(e)),
        };
        if code::api::is_api(req.code) && !who.internal {
            metrics::counter!("rocketgate_acl_denied_total", "door" => "native", "action" => "broker_api")
                .increment(1);
            return Err(Fail::new(
                response::NO_PERMISSION,
                format!(
                    "user {:?} may not call the broker API: only the internal credential may",
                    who.user
                ),
            ));
        }
        let generation = auth.generation();
        let grant = match &self.last {
            Some((user, g, grant)) if *user == who.user && *g == generation => grant.clone(),
            _ => {
                let grant = Arc::new(auth.grant(&who, ""));
                self.last = Some((who.user.clone(), generation, grant.clone()));
                grant
            }
        };
        permitted(&grant, req).map_err(|what| {
            metrics::counter!("rocketgate_acl_denied_total", "door" => "native", "action" => "request")
                .increment(1);
            tracing::info!(user = %who.user, code = req.code, %what, "native request denied by the ACL");
            Fail::new(
                response::NO_PERMISSION,
                format!("user {:?} is not allowed {what}", who.user),
            )
        })
    }
}

impl ConnAccess {
    /// The user a verified client certificate names, logged in once per store
    /// generation.
    fn certificate_user(
        &mut self,
        auth: &Auth,
        peer: std::net::IpAddr,
        name: &str,
    ) -> Result<Identity, Denied> {
        let generation = auth.generation();
        if self.certificate_ok != Some(generation) {
            auth.login_now(Credentials::Certificate(name), peer, "native")?;
            self.certificate_ok = Some(generation);
        }
        Ok(Identity {
            user: name.to_owned(),
            internal: false,
        })
    }
}

/// The `TAGS` property of a RocketMQ properties string (`k\u{1}v\u{2}...`).
fn tags_of(properties: &str) -> Option<&str> {
    properties.split('\u{2}').find_map(|kv| {
        let (k, v) = kv.split_once('\u{1}')?;
        (k == "TAGS" && !v.is_empty()).then_some(v)
    })
}

/// Ok, or what was not allowed.
fn permitted(grant: &Grant, req: &RemotingCommand) -> Result<(), String> {
    if grant.is_all() {
        return Ok(());
    }
    let topic = || req.field(field::TOPIC).unwrap_or("");
    let check = |ok: bool, what: String| if ok { Ok(()) } else { Err(what) };
    match req.code {
        request::SEND_MESSAGE | request::SEND_MESSAGE_V2 | request::SEND_BATCH_MESSAGE => {
            let v2 = req.field("b").is_some();
            let topic = if v2 {
                req.field("b")
            } else {
                req.field(field::TOPIC)
            }
            .unwrap_or("");
            let props = if v2 {
                req.field("i")
            } else {
                req.field(field::PROPERTIES)
            }
            .unwrap_or("");
            let name = match tags_of(props) {
                Some(tag) if req.code != request::SEND_BATCH_MESSAGE => format!("{topic}/{tag}"),
                _ => topic.to_owned(),
            };
            check(grant.may_publish(&name), format!("to publish to {name}"))
        }
        request::PULL_MESSAGE
        | request::LITE_PULL_MESSAGE
        | request::QUERY_CONSUMER_OFFSET
        | request::UPDATE_CONSUMER_OFFSET => {
            let group = req.field(field::CONSUMER_GROUP).unwrap_or("");
            check(
                grant.may_subscribe(topic(), Some(group)),
                format!("to read {} as group {group}", topic()),
            )
        }
        request::CONSUMER_SEND_MSG_BACK => {
            let group = req.field(field::GROUP).unwrap_or("");
            check(
                grant.may_consume_as(group),
                format!("to consume as group {group}"),
            )
        }
        request::GET_CONSUMER_LIST_BY_GROUP => {
            let group = req.field(field::CONSUMER_GROUP).unwrap_or("");
            check(
                grant.may_consume_as(group),
                format!("to consume as group {group}"),
            )
        }
        request::GET_MAX_OFFSET | request::GET_MIN_OFFSET | request::SEARCH_OFFSET_BY_TIMESTAMP => {
            check(
                grant.may_subscribe(topic(), None),
                format!("to read {}", topic()),
            )
        }
        request::QUERY_MESSAGE
        | request::VIEW_MESSAGE_BY_ID
        | request::UPDATE_AND_CREATE_TOPIC
        | request::GET_TOPIC_STATS_INFO
        | request::GET_CONSUME_STATS => check(grant.may_admin(), "admin requests".to_owned()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_from_properties() {
        assert_eq!(tags_of("KEYS\u{1}k\u{2}TAGS\u{1}x\u{2}"), Some("x"));
        assert_eq!(tags_of("TAGS\u{1}\u{2}"), None);
        assert_eq!(tags_of(""), None);
    }
}
