//! The JSON header, as fastjson writes Java's `RemotingCommand`:
//!
//! ```json
//! {"code":105,"extFields":{"topic":"T"},"flag":0,"language":"JAVA","opaque":7,
//!  "serializeTypeCurrentRPC":"JSON","version":401}
//! ```
//!
//! Fields sorted by name, `remark` and `extFields` left out when absent. On read: unknown
//! fields are ignored, `language` may be a name or a number, ext-field values that are
//! numbers or booleans are taken as their text, and fastjson's relaxed syntax is accepted.

use std::collections::HashMap;
use std::fmt::Write;

use serde::Deserialize;

use super::{CodecError, LanguageCode, RemotingCommand, fastjson};

#[derive(Deserialize)]
#[serde(untagged)]
enum Language {
    Name(String),
    Code(i64),
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Header {
    code: i32,
    language: Option<Language>,
    version: i32,
    opaque: i32,
    flag: i32,
    remark: Option<String>,
    ext_fields: Option<HashMap<String, serde_json::Value>>,
}

pub(super) fn decode_header(header: &[u8]) -> Result<RemotingCommand, CodecError> {
    let h: Header = fastjson::from_slice(header).map_err(CodecError::JsonHeader)?;
    let language = match h.language {
        Some(Language::Name(n)) => LanguageCode::from_name(&n),
        Some(Language::Code(c)) => {
            u8::try_from(c).map_or(LanguageCode::Other, LanguageCode::from_code)
        }
        None => LanguageCode::Java,
    };
    let ext_fields = h
        .ext_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| {
            let v = match v {
                serde_json::Value::Null => return None,
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            Some((k, v))
        })
        .collect();
    Ok(RemotingCommand {
        code: h.code,
        language,
        version: h.version,
        opaque: h.opaque,
        flag: h.flag,
        remark: h.remark,
        ext_fields,
        ..Default::default()
    })
}

fn push_str(out: &mut String, s: &str) {
    // Serializing a &str to JSON cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()));
}

pub(super) fn encode_header(cmd: &RemotingCommand) -> Vec<u8> {
    let mut out = String::with_capacity(128);
    let _ = write!(out, "{{\"code\":{}", cmd.code);
    if !cmd.ext_fields.is_empty() {
        let fields = cmd.ext_fields.sorted();
        out.push_str(",\"extFields\":{");
        for (i, (k, v)) in fields.into_iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_str(&mut out, k);
            out.push(':');
            push_str(&mut out, v);
        }
        out.push('}');
    }
    let _ = write!(
        out,
        ",\"flag\":{},\"language\":\"{}\",\"opaque\":{}",
        cmd.flag,
        cmd.language.name(),
        cmd.opaque
    );
    if let Some(remark) = &cmd.remark {
        out.push_str(",\"remark\":");
        push_str(&mut out, remark);
    }
    let _ = write!(
        out,
        ",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":{}}}",
        cmd.version
    );
    out.into_bytes()
}
