//! The authentication paths on arbitrary input (issue #26): a decoded remoting frame's
//! ext fields and body through the signature check (as the native door and the
//! NameServer run it), arbitrary text as a JWT, and arbitrary topic names and filters
//! through the ACL matcher. Properties: no panic; a frame signed with the right
//! secret verifies and the same frame with one body byte changed does not.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use rocketgate_auth::acl::{filter_covers, filter_matches, filters_overlap};
use rocketgate_auth::{Action, Grant, Placeholders, Rule, jwt, sign};
use rocketgate_remoting::FrameCodec;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    if let Ok(Some(mut cmd)) = FrameCodec::new(64 * 1024).decode(&mut buf) {
        let fields: Vec<(&str, &str)> = cmd.ext_fields.iter().collect();
        let given = cmd.field(sign::SIGNATURE).unwrap_or("");
        let _ = sign::verify(b"secret", fields.iter().copied(), &cmd.body, given);
        // Sign it properly: it must verify, and not once the body changes.
        cmd.ext_fields.insert(sign::ACCESS_KEY, "ak".to_owned());
        let sig = sign::signature(b"secret", cmd.ext_fields.iter(), &cmd.body);
        cmd.ext_fields.insert(sign::SIGNATURE, sig.clone());
        let fields: Vec<(&str, &str)> = cmd.ext_fields.iter().collect();
        assert!(sign::verify(b"secret", fields.iter().copied(), &cmd.body, &sig));
        let mut body = cmd.body.to_vec();
        body.push(0);
        assert!(!sign::verify(b"secret", fields.iter().copied(), &body, &sig));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(Some(keys)) = jwt::Keys::new(Some(b"k"), None, "sub") {
            let _ = keys.verify(text);
        }
        let (a, b) = text.split_at(text.len() / 2);
        let _ = (filter_matches(a, b), filter_covers(a, b), filters_overlap(a, b));
        let rules = [Rule::allow(&[Action::Publish, Action::Subscribe], &[a])];
        let g = Grant::new(&rules, Placeholders { username: b, clientid: a });
        let _ = (g.may_publish(b), g.may_subscribe(b, Some(a)), g.may_admin());
    }
});
